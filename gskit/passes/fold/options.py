"""What fold takes and what it reports: :class:`FoldOptions` (the single source of the defaults for the
library call, the CLI flags and the recipe step) and :class:`FoldReport`."""

from __future__ import annotations

from dataclasses import dataclass, field

from gskit.passes.transform import option


@dataclass
class FoldReport:
    """What ``fold`` did.

    Attributes:
        nodes_before: nodes in the graph and its subgraphs before folding.
        nodes_after: the same after folding and cleanup.
        passes: folding passes run (the last one changed nothing unless ``max_passes`` was reached).
        folded_ops: removed nodes by op (``domain::op`` outside the default domain), most first.
        excluded: nodes that were never evaluated although their inputs were constant, with the reason.
        failures: folds that failed and were skipped (only with ``allow_partial``).
        restored_outputs: graph outputs whose dtype or shape was restored after folding.
        mode: how constant nodes were evaluated: ``"graphsurgeon"`` (whole graph at once) or ``"batched"``
            (over ``batched._PARTITION_BYTES`` of constants, or weights on disk: batch by batch, weights read
            per batch).
        evaluated_nodes: batched mode: nodes evaluated on onnxruntime and replaced by their results.
        batches: batched mode: onnxruntime runs.
        spilled_bytes: batched mode: bytes of folded constants written to a data file, not kept in memory.
    """

    nodes_before: int = 0
    nodes_after: int = 0
    passes: int = 0
    folded_ops: dict[str, int] = field(default_factory=dict)
    excluded: dict[str, str] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    restored_outputs: list[str] = field(default_factory=list)
    mode: str = "graphsurgeon"
    evaluated_nodes: int = 0
    batches: int = 0
    spilled_bytes: int = 0


def _bytes_or_no_limit(text: str) -> int | None:
    """The CLI's ``--size-threshold``: a byte count, 0 meaning no limit."""
    return int(text) or None


@dataclass(frozen=True)
class FoldOptions:
    """Constant folding to a fixed point, safe around plugin nodes (``fold``'s options; the single source
    of their defaults for the library call, the CLI flags and the recipe step)."""

    max_passes: int = option(
        10, help="most folding passes; folding stops earlier when a pass changes nothing", metavar="N"
    )
    fold_shapes: bool = option(
        True, help="turn Shape (and Shape -> Gather/Slice) of tensors with static dims into constants"
    )
    size_threshold: int | None = option(
        16 * 2**20,
        help="largest constant fold may create, in bytes (0 on the CLI, null in a recipe: no limit)",
        metavar="BYTES",
        parse=_bytes_or_no_limit,
    )
    allow_partial: bool = option(False, help="skip folds onnxruntime cannot evaluate instead of failing")
