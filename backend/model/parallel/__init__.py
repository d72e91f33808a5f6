"""Tensor and pipeline parallelism for the torch runtime, applied to a built model (backend/model/decoder.py knows
nothing of it): tensor_parallel.py, pipeline_parallel.py, rank_model.py (one rank's shard), driver.py (rank 0,
inside the engine) and worker.py (the other ranks' processes)."""
