"""Measurement: timing harness, statistics, serving load, replicas per GPU, pinned baselines."""
