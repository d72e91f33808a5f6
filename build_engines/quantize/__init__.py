"""Post-training quantization of TensorRT-LLM-layout checkpoints: FP8 (E4M3, per-tensor scales), INT4 group-wise
(round-to-nearest or AWQ), INT8 weight-only, and an FP8 KV cache; calibration on local text; held-out quality.

Entry points live in build_engines.quantize.apply (quant_config, quantize_weights, calibrate,
quantize_checkpoint) and build_engines.quantize.evaluate. The number formats themselves (FP8, INT4 packing, INT8)
are on-disk contracts the runtime reads too: backend/formats/{fp8,int4,int8}.py.
"""
