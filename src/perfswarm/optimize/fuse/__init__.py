"""Fused convolution pairs generated and schedule-tuned on this CPU (`perfswarm fuse`); needs the
optional extra perfswarm[fuse] (numba)."""
