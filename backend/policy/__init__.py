"""Tenants, rate limits, admission and canary routing decisions: plain Python, no torch, no Triton."""
