"""The GPU kernel model learned from measurements across GPUs (see model/gpu/learned.py)."""
