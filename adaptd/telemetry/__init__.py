"""Samplers that fill the daemon's snapshot: NVML (GPUs), storage and host."""
