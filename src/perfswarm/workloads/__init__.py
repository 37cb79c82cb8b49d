"""Bundled CPU PyTorch workloads for the demo, tests and benchmarks."""
