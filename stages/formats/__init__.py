"""Model sources: how a model in a given format becomes ONNX."""
