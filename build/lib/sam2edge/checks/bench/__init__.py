"""Benchmarks: bundles and upstream timed on the same photos."""
