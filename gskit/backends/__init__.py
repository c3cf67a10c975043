"""Backends that run a model: onnxruntime (reference, CPU) and TensorRT / TensorRT-RTX."""
