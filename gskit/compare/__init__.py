"""Comparing two runs on the same inputs: runners come from ``gskit.backends``, this package compares.

``options``: the contract every comparison shares (``CompareOptions``, the report header
``ComparisonHeader``, the default tolerance). ``outputs``: output by output, with Polygraphy's ``Comparator``
and per-output tolerances. ``layers``: the first tensor, in the prepared model's order, where two runs part
ways. ``plugins``: each plugin node against the original region it replaced. ``detections``: a model whose
outputs an ``nms`` step changed.

Layer 2 (docs/architecture.md): above the core and the backends, below the pipeline and the CLI.
"""
