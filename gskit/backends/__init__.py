"""Everything that runs a model: onnxruntime (the reference, on a CPU) and TensorRT / TensorRT-RTX.

``ort``: onnxruntime sessions that run plugin nodes through their numpy references, and the Polygraphy runner
around them. ``trt``: which TensorRT is installed, the GPU probe, the one TensorRT runner and ``run_engine``,
the worker subprocess; ``trt_check`` and ``trt_build`` parse and build through it. ``ort_extensions``: the
onnxruntime-extensions PyOp API that ``ort`` runs plugin references with, without that package's converters.
``model_run``: what a comparison asks either of them to run (``ModelRun``; both answer ``comparison_runner``,
``run_unit`` and ``tensor_source``). ``trt_plugin`` registers a plugin with TensorRT's Python plugin API from
its spec (what ``ort`` does for onnxruntime; a plugin folder's ``trt_plugin.py`` calls it); ``trt_support`` is
the static table of what TensorRT's parser takes, ``trt_check``'s answer when no TensorRT is installed. Core
modules never import this package (the listed exceptions: ``fold``'s lazy evaluation and ``tensor_types``'
lazy symbolic shape inference); compare and the pipeline ask it for runners. See docs/architecture.md.
"""
