"""Between Triton and the engine: engine loop, tensor contract, config.pbtxt reader, pre/postprocessing."""
