"""The torch decoder and what runs it: config, loader, StepInputs, runner, quantized modules, parallelism."""
