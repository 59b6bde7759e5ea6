"""Runtimes the stages run models on (ONNX Runtime, TensorRT, PyTorch) and what this machine can run."""
