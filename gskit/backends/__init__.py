"""Everything that runs a model: onnxruntime (the reference, on a CPU) and TensorRT / TensorRT-RTX.

``ort``: onnxruntime sessions that run plugin nodes through their numpy references, and the Polygraphy
runner around them. ``trt``: which TensorRT is installed, the GPU probe, the one TensorRT runner and
``run_engine``, the worker subprocess; ``trt_check`` and ``trt_build`` parse and build through it. Core
modules never import this package (``fold``'s lazy evaluation is the one listed exception); compare and the
pipeline ask it for runners. See docs/architecture.md.
"""
