"""trtflow: declarative, resumable pipelines from a trained model to validated TensorRT engines."""

__version__ = "0.1.0"
