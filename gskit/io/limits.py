"""Numbers that ONNX and numpy hold: 64-bit integers, finite float32 constants.

Numbers arrive from recipes and the command line as Python integers of any size and floats of any range; a
400-digit dim, seed or attribute value would otherwise fail deep inside protobuf or numpy (``OverflowError``,
``Value out of range``). Whoever takes such a number checks it here and names the option in one line.
"""

from __future__ import annotations

import math

import numpy as np

from gskit.errors import GskitError

#: What an ONNX integer (a dim, an INT attribute, an int64 tensor) holds.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: Largest finite float32 (a constant made from a list of numbers is float32).
FLOAT32_MAX = float(np.finfo(np.float32).max)


def short_number(number: int | float) -> str:
    """A number as a message shows it: ``9999999999...999999 (400 digits)`` past 24 digits."""
    text = str(number)
    digits = len(text.lstrip("-"))
    return text if digits <= 24 else f"{text[:10]}...{text[-6:]} ({digits} digits)"


def fits_int64(number: int) -> bool:
    """Whether an integer fits in an ONNX int64."""
    return INT64_MIN <= number <= INT64_MAX


def check_int64(number: int, where: str) -> int:
    """``number`` if it fits in 64 bits.

    Raises:
        GskitError: ``where: 1234...(400 digits) is out of range; integers fit in 64 bits``.
    """
    if not fits_int64(number):
        raise GskitError(f"{where}: {short_number(number)} is out of range; integers fit in 64 bits")
    return number


def check_integers(value: object, where: str) -> None:
    """Every integer in a value (lists, tuples and mappings, keys included) fits in 64 bits.

    Raises:
        GskitError: naming ``where`` and the first integer that does not.
    """
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, (list, tuple)):
            pending.extend(item)
        elif isinstance(item, int) and not isinstance(item, bool):
            check_int64(item, where)


def number_array(numbers: list[int | float], where: str) -> np.ndarray:
    """A constant from a list of numbers: int64 when all are integers, else float32.

    Raises:
        GskitError: an integer out of int64, or a finite number beyond float32 (it would become inf).
    """
    if all(isinstance(n, int) and not isinstance(n, bool) for n in numbers):
        for n in numbers:
            check_int64(int(n), where)
        return np.array(numbers, dtype=np.int64)
    for n in numbers:
        if math.isfinite(n) and abs(n) > FLOAT32_MAX:
            raise GskitError(f"{where}: {short_number(n)} is beyond float32 (at most {FLOAT32_MAX:.7g})")
    return np.array(numbers, dtype=np.float32)
