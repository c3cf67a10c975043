"""Constant folding that keeps the model's meaning: graphsurgeon's ``fold_constants``, unsafe parts replaced.

``fold(model)`` repeats, up to ``max_passes`` times or until nothing changes:

1. shape inference (on a weightless view of the graph, so it works past 2 GB); where onnx leaves the input
   of a ``Shape`` unknown (main graph or subgraph), onnxruntime's symbolic shape inference (Polygraphy's
   default) is asked too,
2. gskit's own shape folding: ``Shape`` (honouring its ``start``/``end`` attributes) and ``Shape -> Gather`` /
   ``Shape -> Slice`` (also through an integer ``Cast``) become constants where the dims they read are static,
3. evaluation on onnxruntime of the nodes whose inputs are all constant, as graphsurgeon's ``fold_constants``
   decides and runs it with its shape folding, cast elision, ``If`` flattening and subgraph recursion turned
   off (``whole_graph.evaluate_like_graphsurgeon``: the same decisions, made on the graph instead of a copy;
   with ``allow_partial``, graphsurgeon's own fold and its partitioning),
4. gskit's own flattening of ``If`` nodes with a constant condition, and recursion into subgraphs,

then cleans up and sorts the graph and gives graph outputs back the dtype and shape they had.

Models whose constants exceed ``_PARTITION_BYTES`` (1.5 GB; protobuf cannot serialize 2 GB) or whose
weights are still on disk (``gskit.io.model.load(path, load_weights=False)``) are never serialized whole: step
3 becomes gskit's batched evaluation. The nodes whose inputs are all constant are grouped, in topological
order, into batches reading and writing at most ``_BATCH_BYTES``; each batch becomes a small model (those
nodes only) whose large constants are fed as inputs, read from disk just for that batch. Folded constants of
``_SPILL_BYTES`` or more go to a temporary data file and stay on disk as lazy values, so
``gskit.io.model.save`` streams them and peak memory stays near one batch. A batch that onnxruntime cannot
evaluate is evaluated node by node, so the error (or, with ``allow_partial``, the failure recorded in the
report) names the node. Nodes with subgraphs are not evaluated in this mode (constant ``If`` nodes are still
flattened).

Why not graphsurgeon's defaults (each found with onnx's backend node tests,
``tests/test_fold_conformance.py``):

* its shape folding ignores ``Shape``'s ``start``/``end`` attributes (opset 15) and folds the whole shape;
* its cast elision turns ``Cast(int->float) -> op -> Cast(->int)`` into the integer op, which changes results
  (fractional constants, comparison outputs);
* its ``If`` flattening rebinds the producer of a branch output that is an outer-scope tensor or a constant,
  corrupting the outer graph;
* its subgraph recursion drops ``should_exclude_node``, so plugin nodes inside subgraphs would be evaluated;
* it hands sequences and optionals returned by onnxruntime to ``Constant``;
* it cleans up the copy it evaluates with ``remove_unused_graph_inputs=True``, subgraphs included, so a
  constant ``Loop`` whose body never reads the iteration number loses that input and onnxruntime rejects it:
  such nodes are not evaluated.

Kept on purpose where Polygraphy removes nodes: graphsurgeon's cast elision (above; on PaddleOCR's SLANet it
removes 8 more ``Cast`` nodes than gskit) and constants over ``size_threshold`` (16 MiB by default, none in
Polygraphy's CLI).

Never evaluated: plugin nodes (``gskit.plugin.ops.is_plugin_node``: a domain onnxruntime does not implement, a
``plugin_namespace`` attribute, or the ``(namespace, name, version)`` of a loaded plugin spec), random ops,
and nodes whose outputs are sequences or optionals. Constants around them still fold.

The package's modules each own one part: ``fold_pass`` (``fold``, ``FOLD`` and the fixed-point loop),
``options`` (``FoldOptions``, ``FoldReport``), ``exclusion`` (what is never evaluated, and the size limits),
``cost`` (what evaluating a node costs, judged before it runs), ``whole_graph`` (the whole-graph evaluation),
``batched`` (the batch-by-batch evaluation), ``shape_nodes`` (shape folding), ``constant_if`` (``If``
flattening).
"""

from gskit.passes.fold.exclusion import FOLD_GROWTH, NEVER_FOLD_OPS
from gskit.passes.fold.fold_pass import FOLD, fold
from gskit.passes.fold.options import FoldOptions, FoldReport

__all__ = ["FOLD", "FOLD_GROWTH", "NEVER_FOLD_OPS", "FoldOptions", "FoldReport", "fold"]
