"""What EfficientNMS_TRT replaces: nothing by pattern.

NMS changes a model's outputs (raw head output in, four detection tensors out), which a pattern rewrite into
one node with the same outputs cannot say. ``gskit prepare --nms`` (the ``nms`` step, ``gskit.passes.nms``)
reads the detection head and writes the node; a node already written by an exporter (YOLOv7's
``TRT::EfficientNMS_TRT``) is this plugin as it is.
"""

from __future__ import annotations

PATTERNS: tuple = ()
