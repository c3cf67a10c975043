"""Launch configurations of the row-wise plugin kernels (RMSNorm, LayerNorm): block, rows per program, warps.

A norm kernel reads each row once and writes it once, so it is bound by memory bandwidth; it gets close to
the bandwidth floor when the whole row stays in registers (one read of x), every load is wide, and enough
programs are in flight. :func:`row_launch` is the shipped rule: a row of up to :data:`MAX_FIT` elements is
held whole in registers (``BLOCK`` = the next power of two), short rows are packed several to a program.
Rows per program and warps come from :data:`TUNED`, the picks of a sweep of :func:`row_candidates` on an
H100 (``bench/tune_kernels.py``; rows of 768, 4096, 8192 and 11008 elements, float32/float16/bfloat16):
1.00-1.10x the bandwidth floor on 16384 rows (1.13-1.37x for 768-element rows, whose 17-34 us floor is
within a few microseconds of a launch's fixed cost) and faster than PyTorch eager on every shape. Rows
longer than MAX_FIT are read in ``MAX_BLOCK`` chunks (one program per row; not timed yet). Pure Python, no
Triton: the kernels' ``aot_kernel`` (the TensorRT ahead-of-time path) and the JIT wrappers both call it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

#: Longest row held whole in registers (one read of x); longer rows are read in chunks.
MAX_FIT = 16384
#: Chunk length for rows longer than MAX_FIT.
MAX_BLOCK = 4096
#: Bytes per element of the Triton types the AOT kernels are compiled for.
TRITON_ITEMSIZE = {"fp32": 4, "fp16": 2, "bf16": 2}


@dataclass(frozen=True)
class RowLaunch:
    """How a row-wise kernel is launched for rows of ``cols`` elements.

    Attributes:
        block: elements of a row read at once (a power of two).
        rows: rows per program (1 for chunked rows).
        num_warps: warps per program.
        fits: the row is held whole in registers (``block >= cols``); else it is read in chunks.
    """

    block: int
    rows: int
    num_warps: int
    fits: bool

    def programs(self, rows: int) -> int:
        """Programs for ``rows`` rows."""
        return -(-rows // self.rows)


def epsilon_constant(epsilon: float) -> float:
    """``epsilon`` rounded to float32, as the ONNX attribute holds it."""
    return float(np.float32(epsilon))


def row_constexprs(launch: RowLaunch, epsilon: float) -> dict[str, Any]:
    """The row kernels' compile-time parameters (``EPS``, ``BLOCK``, ``ROWS``, ``FITS``) for a launch."""
    return {"EPS": epsilon_constant(epsilon), "BLOCK": launch.block, "ROWS": launch.rows, "FITS": launch.fits}


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= ``n`` (1 for n <= 1)."""
    return 1 << max(int(n) - 1, 0).bit_length()


#: The sweep's pick per (bytes per element, BLOCK): (rows per program, warps). Read off an H100
#: (bench/gpu_runs/h100-2026-11-27/tune.json): for each entry the candidate within 2.4% of the fastest on
#: 16384 rows for both norms and all dtypes of that size, ties broken by the 1- and 64-row times.
TUNED: dict[tuple[int, int], tuple[int, int]] = {
    (4, 1024): (4, 4),
    (4, 4096): (1, 16),
    (4, 8192): (1, 32),
    (4, 16384): (1, 16),
    (2, 1024): (2, 1),
    (2, 4096): (2, 16),
    (2, 8192): (1, 16),
    (2, 16384): (1, 16),
}


def row_launch(cols: int, itemsize: int = 4) -> RowLaunch:
    """The shipped launch rule for rows of ``cols`` elements of ``itemsize`` bytes (see the module docstring).

    :data:`TUNED` where the sweep measured the row's block; elsewhere rows per program make a program move
    at least about 8 KiB when rows are short, and warps give each thread 16 (4-byte) or 32 (2-byte) elements,
    at most 16 warps.
    """
    block = next_power_of_2(max(int(cols), 1))
    if block > MAX_FIT:
        return RowLaunch(MAX_BLOCK, 1, 16, False)
    size = 4 if itemsize >= 4 else 2
    if (size, block) in TUNED:
        rows, warps = TUNED[size, block]
        return RowLaunch(block, rows, warps, True)
    rows = max(1, min(16, 8192 // (block * itemsize)))
    per_thread = 16 if itemsize >= 4 else 32
    warps = max(1, min(16, block * rows // (32 * per_thread)))
    return RowLaunch(block, rows, _power_of_2_at_most(warps), True)


def row_candidates(cols: int, itemsize: int = 4) -> list[RowLaunch]:
    """Launch configurations the tuning sweep times for rows of ``cols`` elements (the rule's pick too).

    Rows per program and warps around the rule's choice: for short rows several rows per program, for long
    rows more warps.
    """
    block = next_power_of_2(max(int(cols), 1))
    if block > MAX_FIT:
        return [RowLaunch(MAX_BLOCK, 1, w, False) for w in (8, 16, 32)]
    found = {row_launch(cols, itemsize)}
    if block <= 2048:
        for rows in (1, 2, 4, 8, 16):
            for warps in (1, 2, 4, 8):
                elements = block * rows // (32 * warps)
                if 4 <= elements <= 64 and block * rows <= 16384:
                    found.add(RowLaunch(block, rows, warps, True))
    else:
        for rows in (1, 2) if block <= 4096 else (1,):
            for warps in (4, 8, 16, 32):
                elements = block * rows // (32 * warps)
                if 4 <= elements <= 64:
                    found.add(RowLaunch(block, rows, warps, True))
    return sorted(found, key=lambda c: (c.rows, c.num_warps))


def _power_of_2_at_most(n: int) -> int:
    return 1 << (max(int(n), 1).bit_length() - 1)
