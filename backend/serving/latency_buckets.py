"""Histogram buckets (seconds) of the latency metrics published through Triton (TTFT, inter-token latency).

A module of its own so that the canary router's metrics take them without importing the engine (and torch) into
each of its instances' processes (backend/serving/router_metrics.py).
"""
LATENCY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]
