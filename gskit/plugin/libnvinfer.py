"""TensorRT's own plugins: the creators ``libnvinfer_plugin`` registers, from which TensorRT release, and
whether they are deprecated or removed.

A model needs no implementation of these: ``initLibNvInferPlugins`` (Python:
``trt.init_libnvinfer_plugins(logger, "")``, which Polygraphy's loaders call) registers them in namespace
``""``. A gskit plugin folder whose spec has ``library=LIBRARY`` describes one of them (its inputs, outputs
and fields as NVIDIA/TensorRT's ``plugin/<name>/`` defines them, a numpy reference and patterns);
``check_trt`` asks :func:`shipped_plugin` for any plugin node, spec or not, so a node of a removed plugin is
named as such.

Facts from NVIDIA/TensorRT (the repository's ``CHANGELOG.md``, ``plugin/api/inferPlugin.cpp`` of each release,
each plugin's ``README.md`` and creator source), read at the commits named in :data:`SOURCE`. Versions are
TensorRT releases (``major.minor``).
"""

from __future__ import annotations

from dataclasses import dataclass

#: The library that implements these plugins (``PluginSpec.library`` of a spec describing one).
LIBRARY = "libnvinfer_plugin"
#: TensorRT namespace of its own plugins (what ``initLibNvInferPlugins(logger, "")`` registers them under).
NAMESPACE = ""
#: ONNX domain gskit writes their nodes in. The TensorRT parser ignores the domain (it looks the creator up by
#: op type, ``plugin_version`` and ``plugin_namespace``); onnx and onnxruntime need a domain other than the
#: default one for an op they do not know. ``TRT`` is also what YOLOv7's ``--end2end`` export writes.
DOMAIN = "TRT"
#: The PluginSpec fields of a spec describing one of these plugins: ``PluginSpec(name=..., version=...,
#: **libnvinfer.SPEC_FIELDS, ...)``.
SPEC_FIELDS = {"namespace": NAMESPACE, "node_domain": DOMAIN, "library": LIBRARY}
#: Where the facts below were read: NVIDIA/TensorRT at 11.1 (and earlier releases for removed plugins).
SOURCE = (
    "NVIDIA/TensorRT@82d1dca801c8318a5605399d5240780d0679e4e1 (11.1 OSS release): CHANGELOG.md, "
    "plugin/api/inferPlugin.cpp; @52399f555c2f80cb690a4a558b604e1a5f227e7c (10.16) for plugins removed "
    "in 11.0"
)


@dataclass(frozen=True)
class ShippedPlugin:
    """One creator (name and version) of ``libnvinfer_plugin`` and its life.

    Attributes:
        name: creator name (the node's op type).
        version: creator version (the node's ``plugin_version``).
        added: first TensorRT release that registers it; None where gskit did not record it (plugins of
            TensorRT 7 and earlier that are gone now).
        deprecated: release that deprecated it (still registered), or None.
        removed: first release that no longer registers it, or None.
        replacement: what to use instead, for a deprecated or removed one.
        note: one line of what else to know (a field added later, a README that disagrees with the source).
    """

    name: str
    version: str
    added: str | None
    deprecated: str | None = None
    removed: str | None = None
    replacement: str = ""
    note: str = ""

    @property
    def label(self) -> str:
        """``EfficientNMS_TRT v1``."""
        return f"{self.name} v{self.version}"

    def life(self) -> str:
        """``libnvinfer_plugin since TensorRT 8.0, deprecated since 10.12 (use ...)``."""
        text = f"{LIBRARY} since TensorRT {self.added}" if self.added else LIBRARY
        if self.removed:
            text += f", removed in {self.removed}"
        elif self.deprecated:
            text += f", deprecated since {self.deprecated}"
        if self.replacement and (self.removed or self.deprecated):
            text += f" (use {self.replacement})"
        return text

    def problem(self, tensorrt: str | None) -> str | None:
        """Why TensorRT ``tensorrt`` (``"10.3"``) cannot load this creator, or None when it can (or when the
        version is not known)."""
        if tensorrt is None:
            return None
        have = version_key(tensorrt)
        if self.added and have < version_key(self.added):
            return f"TensorRT {tensorrt} predates {self.label} (added in {self.added})"
        if self.removed and have >= version_key(self.removed):
            use = f"; use {self.replacement}" if self.replacement else ""
            return f"{self.label} was removed in TensorRT {self.removed}{use}"
        return None


_NMS_LAYER = "INMSLayer (ONNX NonMaxSuppression)"
_V2_IS_V3 = "version 2 (IPluginV3, same inputs, outputs and fields)"

#: The creators gskit knows, plugins it targets first. Not every creator of the library: the ones a model
#: prepared for TensorRT meets (detection, deformable ops) and those removed in 11.0.
SHIPPED_PLUGINS: tuple[ShippedPlugin, ...] = (
    ShippedPlugin(
        "EfficientNMS_TRT",
        "1",
        "8.0",
        deprecated="10.12",
        replacement=_NMS_LAYER,
        note="field class_agnostic from 8.6 (older parsers drop it silently: per-class NMS)",
    ),
    ShippedPlugin(
        "EfficientNMS_ONNX_TRT",
        "1",
        "8.0",
        deprecated="9.0",
        removed="11.0",
        replacement=_NMS_LAYER,
        note="its README says removed in 10.16; the 10.16 source still registers it, 11.0's does not",
    ),
    ShippedPlugin(
        "MultiscaleDeformableAttnPlugin_TRT", "1", "8.4", deprecated="10.11", replacement=_V2_IS_V3
    ),
    ShippedPlugin("MultiscaleDeformableAttnPlugin_TRT", "2", "10.11"),
    ShippedPlugin(
        "ModulatedDeformConv2d",
        "1",
        "8.6",
        deprecated="10.12",
        replacement=_V2_IS_V3,
        note="its README says deprecated since 10.11; the CHANGELOG lists it under 10.12",
    ),
    ShippedPlugin("ModulatedDeformConv2d", "2", "10.11"),
    ShippedPlugin("ROIAlign_TRT", "1", "8.5", note="the parser inserts it for ONNX RoiAlign"),
    *(
        ShippedPlugin(name, "1", None, deprecated="9.0", removed="11.0", replacement=_NMS_LAYER)
        for name in ("BatchedNMS_TRT", "BatchedNMSDynamic_TRT", "NMS_TRT", "NMSDynamic_TRT")
    ),
    *(
        ShippedPlugin(name, "1", None, deprecated="9.0", removed="11.0", replacement=use)
        for name, use in (
            ("BatchTilePlugin_TRT", "Tile / Expand"),
            ("Clip_TRT", "Clip"),
            ("CoordConvAC", "Concat of coordinate channels"),
            ("CropAndResize", "CropAndResizeDynamic v2"),
            ("CustomGeluPluginDynamic", "Gelu (opset 20) or its Erf form"),
            ("LReLU_TRT", "LeakyRelu"),
            ("Normalize_TRT", "ReduceL2 and Div"),
            ("Proposal", "ProposalDynamic"),
            ("SpecialSlice_TRT", "Slice"),
            ("Split", "Split"),
        )
    ),
)

_BY_KEY = {(p.name, p.version): p for p in SHIPPED_PLUGINS}


def shipped_plugin(name: str, version: str) -> ShippedPlugin | None:
    """The creator ``name`` version ``version`` of ``libnvinfer_plugin``; None when gskit knows none."""
    return _BY_KEY.get((name, version))


def version_key(version: str) -> tuple[int, ...]:
    """``"10.12"`` -> ``(10, 12)``, for comparing TensorRT releases (a non-numeric part counts as 0)."""
    return tuple(int(part) if part.isdigit() else 0 for part in version.split(".")[:3])
