"""The export stage's library: a model of any format to an ONNX file checked against its framework (`export`
composes it)."""
