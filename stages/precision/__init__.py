"""Lower precision: NVIDIA ModelOpt quantization and conversion, and what they share."""
