"""Benchmarks behind ``plugmq bench``: each reports speeds as ratios to a baseline of the same run."""
