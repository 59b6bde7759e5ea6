"""Accuracy: crash diagnosis, ONNX Runtime numerics work-arounds, precision debugging."""
