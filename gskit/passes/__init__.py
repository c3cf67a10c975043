"""Graph passes: each module owns one transformation or analysis of a model, without running it.

``inspect`` (summaries), ``edit`` (editing primitives and the ``EditOptions`` orchestrator; ``edit_args``: how
an edit is written on the command line), ``isolate`` (cut a subgraph out between named tensors), ``shapes``
(shape inference that knows plugins), ``tensor_types`` (dtypes and shapes on a graph, export without losing
types), ``fold/`` (constant folding that keeps the model's meaning, one module per part: the pass, its
options, exclusions, costs, the two evaluation engines, shape folding, ``If`` flattening), ``sanitize``,
``convert`` (opset, fp16, int64 -> int32), ``patterns/`` (matching patterns and replacing them by plugin
nodes). Each is a library call; ``gskit.pipeline`` runs them as recipe steps. ``transform``: the contract
every pass follows (``GraphPass``, ``run_pass``).

Core layer (docs/architecture.md): no model execution here. The two listed exceptions (scripts/
check_layers.py ``LAZY_CORE_IMPORTS``) ask ``gskit.backends.ort`` from inside a function.
"""
