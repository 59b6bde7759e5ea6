"""Timing a model: the cuda-python harness, what a point feeds and calls, windows until precise, what else ran on
the host, kernel profiles, A/B pairs and select's finalists timed together."""
