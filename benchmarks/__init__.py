"""Benchmarks of accel_mnist beside plain PyTorch: `python -m benchmarks SUITE`.

Run from the repo root; every module is also a command (`python -m benchmarks.repeat ...`).
"""
