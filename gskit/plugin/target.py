"""The TensorRT version a model is prepared for (``--tensorrt VERSION``, recipe ``target: {tensorrt: X}``).

A target decides, for each matched region, which form a plugin's spec offers is written (a plugin node, or the
ONNX op that this TensorRT runs natively, :mod:`gskit.plugin.native`), and which parser table ``check-trt``
answers with. Nothing else in gskit compares TensorRT versions: the versions live in plugin specs and in
``gskit/data/tensorrt_parser.json``.

Without a version given, the target is the installed full TensorRT's (read from package metadata; TensorRT-RTX
is not full TensorRT and does not count), else the newest TensorRT gskit knows (:data:`NEWEST_KNOWN`). The
target records which of these it came from, and reports say so.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass, field
from functools import cache
from importlib.metadata import Distribution, distributions

from gskit.errors import GskitError
from gskit.io.dist_metadata import metadata_field

#: The oldest TensorRT whose ONNX parser gskit has facts about (JetPack 5 ships 8.5).
OLDEST_KNOWN = (8, 5)
#: The newest TensorRT gskit has facts about: the default target when no full TensorRT is installed.
NEWEST_KNOWN = (11, 5)

_VERSION = re.compile(r"(\d+)(?:\.(\d+))?(?:\.\d+)*")


@dataclass(frozen=True, order=True)
class TensorRTTarget:
    """A full TensorRT version, ``major.minor``; compared as a tuple (``10.15 > 10.3``).

    Attributes:
        version: ``(major, minor)``.
        source: where the target came from, for reports (``--tensorrt 10.3``, ``installed TensorRT 10.16.1``,
            ``newest gskit knows: 11.5; no full TensorRT installed``); not part of comparisons.
    """

    version: tuple[int, int]
    source: str = field(default="", compare=False)

    def __str__(self) -> str:
        return f"{self.version[0]}.{self.version[1]}"

    @classmethod
    def parse(cls, text: str | int | float, source: str | None = None) -> TensorRTTarget:
        """``"8.6"``, ``"10.15"``, ``"11"`` (11.0), ``"10.16.1.11"`` (patch and build dropped).

        A version newer than :data:`NEWEST_KNOWN` is taken, its ``source`` saying that the facts of the
        newest known apply (the parser tables, the native forms).

        Raises:
            GskitError: not a version, or older than the oldest TensorRT gskit knows.
        """
        if isinstance(text, float):  # YAML reads 10.10 as 10.1: refuse what cannot be told apart
            raise GskitError(
                f'TensorRT version {text!r} is a number; write it as a string ("{text}"): YAML reads '
                f"10.10 as 10.1"
            )
        written = str(text).strip()
        match = _VERSION.fullmatch(written)
        if match is None:
            raise GskitError(
                f"--tensorrt {written!r}: not a TensorRT version; write it like 10.3, 10.15 or 11"
            )
        found = (int(match.group(1)), int(match.group(2) or 0))
        if found < OLDEST_KNOWN:
            raise GskitError(
                f"--tensorrt {written}: gskit knows TensorRT {_dotted(OLDEST_KNOWN)} and later; "
                f"prepare for {_dotted(OLDEST_KNOWN)} or newer"
            )
        said = source if source is not None else f"--tensorrt {written}"
        if said and found > NEWEST_KNOWN:  # say it where the target is reported: a typo (105 for 10.5) shows
            newest = _dotted(NEWEST_KNOWN)
            said += f"; newer than any TensorRT gskit knows: gskit's facts of {newest} apply"
        return cls(found, said)

    def at_least(self, other: str | tuple[int, int]) -> bool:
        """True when this target is ``other`` (``"10.15"``) or newer."""
        wanted = other if isinstance(other, tuple) else TensorRTTarget.parse(other, "").version
        return self.version >= wanted


def resolve_target(given: str | int | TensorRTTarget | None) -> TensorRTTarget:
    """The target for ``given`` (a version, or None: :func:`default_target`).

    Raises:
        GskitError: ``given`` is not a version gskit can prepare for.
    """
    if isinstance(given, TensorRTTarget):
        return given
    if given is None:
        return default_target()
    return TensorRTTarget.parse(given)


def default_target() -> TensorRTTarget:
    """The installed full TensorRT's version, else the newest gskit knows."""
    installed = installed_tensorrt()
    if installed is not None:
        try:
            return TensorRTTarget.parse(installed, f"installed TensorRT {installed}")
        except GskitError:
            pass  # an installed TensorRT older than gskit knows: the newest known is as good a guess
    newest = _dotted(NEWEST_KNOWN)
    return TensorRTTarget(NEWEST_KNOWN, f"newest gskit knows: {newest}; no full TensorRT installed")


def installed_tensorrt() -> str | None:
    """The version of the installed full TensorRT Python package (module ``tensorrt``), from its metadata.

    The package is not imported: reading which TensorRT is installed must not load it.
    """
    return installed_version("tensorrt")


@cache  # what is installed does not change while a command runs
def installed_version(module: str) -> str | None:
    """The version of the installed distribution that provides the top-level module ``module`` (whatever
    the distribution is called: ``tensorrt_rtx`` comes from ``tensorrt_rtx_cu13``), without importing it.

    Reads each distribution's ``top_level.txt``, or its ``RECORD`` where it has none, as text:
    ``importlib.metadata.packages_distributions`` answers the same but parses the metadata and every file
    entry of every installed distribution (0.3-0.6 s per call with torch installed). A module the import
    system cannot find is not installed (0.5 ms, where reading every distribution took 5-8 ms); the
    distributions whose name starts with the module's are read first (``tensorrt_rtx_cu13``).
    """
    if importlib.util.find_spec(module) is None:
        return None
    prefix = module.lower().replace("-", "_")
    for dist in sorted(
        distributions(), key=lambda d: not str(getattr(d, "_normalized_name", "")).startswith(prefix)
    ):
        if _provides(dist, module):
            return metadata_field(dist, "Version") or dist.version
    return None


def _provides(dist: Distribution, module: str) -> bool:
    """Whether the distribution installs the top-level module or package ``module`` (``module/...``,
    ``module.py``, ``module.cpython-311-x86_64-linux-gnu.so``)."""
    listed = dist.read_text("top_level.txt")
    if listed is not None:
        return module in listed.split()
    lines = "\n" + (dist.read_text("RECORD") or "")
    return f"\n{module}/" in lines or f"\n{module}." in lines


def _dotted(version_tuple: tuple[int, int]) -> str:
    return ".".join(str(v) for v in version_tuple)
