"""Checks: graph lint, numeric fidelity, benchmarks."""
