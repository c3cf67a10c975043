"""Triton kernels compiled to PTX for TensorRT's ahead-of-time plugin launcher (an ``aot_impl``).

TensorRT's AOT launcher calls the kernel with exactly (input pointers, the int32 scalars the ``aot_impl``
returns, output pointers). :func:`triton_ptx` compiles a Triton kernel ordered that way and edits its PTX to
match: Triton >= 3.3 appends hidden pointer parameters to every kernel (``global_scratch``; from 3.5 also
``profile_scratch``) that TensorRT would not pass, so the launch would read past its argument array. They are
dropped when Triton reports no scratch memory and the kernel body never reads them
(:func:`drop_hidden_params`); a kernel that does need scratch memory is refused (run it through the JIT
``impl``). Keep the Triton compile of an ``aot_impl`` in a TensorRT-free function (the plugins'
``kernel.aot_kernel``) so a CPU test can check the PTX (tests/test_trt_aot_ptx.py).
``gskit.backends.trt_plugin.launch`` turns a :class:`TritonPtx` into what an ``aot_impl`` returns.

Triton is imported only inside :func:`triton_ptx`; TensorRT never.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gskit.errors import PluginError

ParamKind = Literal["pointer", "int32"]

#: PTX parameter types by the kind of argument TensorRT's AOT launcher passes there.
PTX_TYPES: Mapping[str, tuple[str, ...]] = {"pointer": ("u64", "b64"), "int32": ("u32", "s32", "b32")}


@dataclass(frozen=True)
class PtxParam:
    """One parameter of a PTX ``.entry``.

    Attributes:
        name: its PTX name (Triton writes ``<kernel>_param_<i>``).
        type: its PTX type without the dot (``u64``, ``u32``...).
    """

    name: str
    type: str


@dataclass(frozen=True)
class KernelParam:
    """One parameter of a kernel compiled for an ``aot_impl``, in the order TensorRT passes arguments.

    Attributes:
        arg: the Triton argument name (``x_ptr``, ``n``).
        kind: ``"pointer"`` (an input or output tensor) or ``"int32"`` (a scalar of the ``aot_impl``).
        ptx: the parameter in the PTX.
    """

    arg: str
    kind: ParamKind
    ptx: PtxParam


@dataclass(frozen=True)
class TritonPtx:
    """A Triton kernel compiled to PTX for an ``aot_impl``.

    Attributes:
        name: the kernel's symbol in the PTX.
        ptx: PTX text whose entry takes exactly ``params`` (hidden Triton parameters dropped).
        block_x: threads per program (``num_warps * 32``).
        shared_mem: dynamic shared memory in bytes.
        params: the entry's parameters: input pointers, int32 scalars, output pointers.
        hidden: PTX names of the hidden parameters Triton appended and :func:`triton_ptx` dropped.
        constexprs: the compile-time values the kernel was compiled with.
    """

    name: str
    ptx: str
    block_x: int
    shared_mem: int
    params: tuple[KernelParam, ...]
    hidden: tuple[str, ...]
    constexprs: Mapping[str, Any]

    @property
    def scalars(self) -> list[str]:
        """Names of the int32 parameters, in order: what ``launch(scalars=...)`` must give."""
        return [p.arg for p in self.params if p.kind == "int32"]


def triton_ptx(
    kernel: Any,
    pointer_types: Mapping[str, str],
    constexprs: Mapping[str, Any],
    target: Any | None = None,
    num_warps: int = 4,
    num_stages: int | None = None,
    divisible_by_16: Sequence[str] = (),
) -> TritonPtx:
    """Compile a ``@triton.jit`` kernel to PTX for an ``aot_impl``; unnamed arguments are ``i32`` scalars.

    The kernel's arguments must be ordered (input pointers, int32 scalars, output pointers, constexprs),
    the order TensorRT's AOT launcher passes them. Hidden parameters Triton appends are dropped from the
    PTX (see :func:`drop_hidden_params`).

    Args:
        kernel: the Triton kernel (a JITFunction; not under ``TRITON_INTERPRET=1``).
        pointer_types: pointer parameter -> element type (``fp32``, ``fp16``...).
        constexprs: compile-time parameter -> value.
        target: a ``triton.backends.compiler.GPUTarget``; None: the current GPU.
        num_warps: warps per program (the launch's ``block_x`` is ``32 * num_warps``).
        num_stages: software-pipelining depth of the kernel's loops; None: Triton's default.
        divisible_by_16: arguments the caller promises are multiples of 16 (pointers: 16-byte aligned
            addresses; ints: values), which lets Triton emit 16-byte loads as its JIT does when it sees
            such values. A promise TensorRT breaks at run time gives wrong results: the shipped plugins
            make none (``bench/tune_kernels.py`` measures what it would gain).

    Raises:
        PluginError: Triton is missing or fails to compile the kernel, the kernel needs scratch memory,
            or its PTX parameters do not follow TensorRT's AOT calling convention.
    """
    try:
        import triton
        from triton.compiler import ASTSource
    except ImportError as err:
        raise PluginError("ahead-of-time kernels need Triton: pip install triton") from err
    kernel_name = getattr(kernel, "__name__", str(kernel))
    signature = {
        name: "constexpr"
        if name in constexprs
        else f"*{pointer_types[name]}"
        if name in pointer_types
        else "i32"
        for name in kernel.arg_names
    }
    unknown = set(divisible_by_16) - set(kernel.arg_names)
    if unknown:
        raise PluginError(f"{kernel_name}: divisible_by_16 names no argument: {', '.join(sorted(unknown))}")
    attrs = {(kernel.arg_names.index(name),): [["tt.divisibility", 16]] for name in divisible_by_16}
    try:
        compiled = triton.compile(
            ASTSource(fn=kernel, signature=signature, constexprs=dict(constexprs), attrs=attrs),
            target=target,
            options={
                "num_warps": int(num_warps),
                **({} if num_stages is None else {"num_stages": num_stages}),
            },
        )
    except Exception as err:  # Triton raises many types; name the kernel
        raise PluginError(f"Triton cannot compile {kernel_name}: {err}") from err
    meta = compiled.metadata
    args = [name for name in kernel.arg_names if signature[name] != "constexpr"]
    scratch = {kind: int(getattr(meta, f"{kind}_scratch_size", 0) or 0) for kind in ("global", "profile")}
    ptx, entry = drop_hidden_params(compiled.asm["ptx"], meta.name, len(args), scratch=scratch)
    params = tuple(
        KernelParam(arg, "pointer" if signature[arg].startswith("*") else "int32", p)
        for arg, p in zip(args, entry[: len(args)], strict=True)
    )
    _check_calling_convention(meta.name, params)
    return TritonPtx(
        meta.name,
        ptx,
        meta.num_warps * 32,
        meta.shared,
        params,
        tuple(p.name for p in entry[len(args) :]),
        dict(constexprs),
    )


def drop_hidden_params(
    ptx: str, name: str, arg_count: int, *, scratch: Mapping[str, int]
) -> tuple[str, list[PtxParam]]:
    """Cut the entry ``name`` to its first ``arg_count`` parameters, the ones TensorRT passes.

    Triton >= 3.3 appends pointer parameters for global (and from 3.5 profile) scratch memory to every
    kernel; its own launcher passes them, TensorRT's AOT launcher does not. They are dropped when
    ``scratch`` says no scratch memory is needed and the PTX never names them. A PTX without them (older
    Triton) is returned unchanged.

    Args:
        ptx: PTX text from Triton.
        name: the kernel's entry.
        arg_count: how many parameters the kernel's non-constexpr arguments make.
        scratch: scratch kind (``global``, ``profile``) -> bytes Triton's metadata asks for.

    Returns:
        The edited PTX, and all the entry's parameters before the edit (the hidden ones last).

    Raises:
        PluginError: the kernel uses scratch memory, which TensorRT's AOT launcher cannot provide, or the
            entry has fewer parameters than arguments or extra parameters that are not pointers.
    """
    start, end = _entry_span(ptx, name)
    items = _split_params(ptx[start:end])
    params = [_ptx_param(name, item) for item in items]
    if len(params) < arg_count:
        raise PluginError(
            f"{name}: the PTX entry has {len(params)} parameters for {arg_count} kernel arguments; "
            "TensorRT would pass misaligned arguments"
        )
    hidden = params[arg_count:]
    if any(p.type not in PTX_TYPES["pointer"] for p in hidden):
        extra = ", ".join(f"{p.name} .{p.type}" for p in hidden)
        raise PluginError(f"{name}: unexpected extra PTX parameters ({extra}) after the kernel arguments")
    body = ptx[end:]
    used = [f"{size} bytes of {kind} scratch" for kind, size in scratch.items() if size > 0]
    used += [f"reads {p.name}" for p in hidden if re.search(rf"(?<![\w$]){re.escape(p.name)}(?![\w$])", body)]
    if used:
        raise PluginError(
            f"{name}: the Triton kernel uses scratch memory ({', '.join(used)}), which TensorRT's AOT "
            "launcher cannot provide; register the plugin without aot_impl (the JIT impl runs it)"
        )
    if not hidden:
        return ptx, params
    kept = ",".join(items[:arg_count]) + ("\n" if arg_count else "")
    return ptx[:start] + kept + ptx[end:], params


def _entry_span(ptx: str, name: str) -> tuple[int, int]:
    """Start and end of the text between the parentheses of ``.entry name(...)``."""
    match = re.search(rf"\.entry\s+{re.escape(name)}\s*\(", ptx)
    end = ptx.find(")", match.end()) if match else -1
    if match is None or end < 0:
        raise PluginError(f"{name}: the PTX has no '.entry {name}(...)'")
    return match.end(), end


def _split_params(text: str) -> list[str]:
    return text.split(",") if text.strip() else []


def _ptx_param(kernel: str, item: str) -> PtxParam:
    match = re.fullmatch(r"\s*\.param\s+(.*?)\s*([A-Za-z_$%][\w$]*)\s*(?:\[\d+\])?\s*", item, re.DOTALL)
    ptx_type = re.search(r"\.([usbf]\d+|pred)\b", match.group(1)) if match else None
    if match is None or ptx_type is None:
        raise PluginError(f"{kernel}: cannot read the PTX parameter {item.strip()!r}")
    return PtxParam(match.group(2), ptx_type.group(1))


def _check_calling_convention(name: str, params: Sequence[KernelParam]) -> None:
    """PTX types match the argument kinds, and the kinds run pointers, int32s, pointers."""
    for p in params:
        if p.ptx.type not in PTX_TYPES[p.kind]:
            raise PluginError(
                f"{name}: argument {p.arg} ({p.kind}) is PTX parameter {p.ptx.name} of type .{p.ptx.type}"
            )
    kinds = "".join("p" if p.kind == "pointer" else "i" for p in params)
    if not re.fullmatch(r"p*i*p*", kinds):
        order = ", ".join(f"{p.arg}: {p.kind}" for p in params)
        raise PluginError(
            f"{name}: TensorRT's AOT launcher passes (input pointers, int32 scalars, output pointers); "
            f"reorder the kernel's arguments ({order})"
        )
