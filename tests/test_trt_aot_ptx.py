"""The AOT PTX of the plugin kernels takes exactly the arguments TensorRT's AOT launcher passes.

Every plugin folder (tests/plugin_folders.py) whose ``kernel.py`` defines ``aot_kernel`` is compiled for
fp32 and fp16 on sm_90 and sm_80; the build-time values its ``aot_impl`` takes from the network (a last
dim, a weight shape) come from the kernel module's ``AOT_EXAMPLE`` dict. Nothing here names a plugin.

TensorRT launches an ``aot_impl`` kernel with (input pointers, the int32 scalars the ``aot_impl`` hands
to ``launch()``, output pointers) and nothing else. Triton >= 3.3 appends hidden scratch pointers to every
kernel; ``gskit.backends.aot_ptx.triton_ptx`` drops them or refuses the kernel. Here each plugin's
``kernel.aot_kernel`` (the TensorRT-free half of its ``aot_impl``) compiles for a named GPU without one,
and the tests check the PTX ``.entry`` against the plugin spec and the ``aot_impl`` source, assemble it
with the ptxas Triton bundles, and check the refusals (scratch memory, argument order, scalar count).

The compiles run once, in a fresh interpreter running this file (``main``): the plugins' test_kernel.py
set ``TRITON_INTERPRET=1`` for the whole session on machines without a GPU, and once Triton is imported
that way no kernel compiles in the same process.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from plugin_folders import plugin_folders, run_compiles

from gskit.backends import aot_ptx, trt_plugin
from gskit.backends.aot_ptx import KernelParam, PtxParam, TritonPtx
from gskit.errors import PluginError
from gskit.plugin import PluginSpec, load_spec_file


@dataclass(frozen=True)
class Case:
    """One AOT compile: a plugin folder, a Triton dtype and an SM (``90`` is sm_90)."""

    plugin: Path
    dtype: str
    sm: int

    def __str__(self) -> str:
        return f"{self.plugin.name}-{self.dtype}-sm{self.sm}"


def _has_aot_kernel(folder: Path) -> bool:
    """kernel.py defines ``aot_kernel`` (read from the source: importing it may need Triton)."""
    tree = ast.parse((folder / "kernel.py").read_text())
    return any(isinstance(n, ast.FunctionDef) and n.name == "aot_kernel" for n in tree.body)


AOT_FOLDERS = [
    f for f in plugin_folders("trt_plugin.py") if (f / "kernel.py").is_file() and _has_aot_kernel(f)
]
CASES = [Case(folder, dtype, sm) for folder in AOT_FOLDERS for sm in (90, 80) for dtype in ("fp32", "fp16")]


def _spec(plugin: Path) -> PluginSpec:
    (spec,) = load_spec_file(plugin / "spec.py")
    return spec


def _aot_kernel_kwargs(plugin: Path, kernel: Any) -> dict[str, Any]:
    """What the plugin's aot_impl passes to ``kernel.aot_kernel`` for a node with the default attributes,
    with the kernel module's ``AOT_EXAMPLE`` build-time values."""
    attrs = {a.name: a.default for a in _spec(plugin).attributes}
    attrs = {k: [int(x) for x in v] if isinstance(v, list) else v for k, v in attrs.items()}
    return {**getattr(kernel, "AOT_EXAMPLE", {}), **attrs}


def _aot_impl_scalar_count(plugin: Path) -> int:
    """How many scalars the plugin's aot_impl hands to ``launch()``, read from trt_plugin.py's source.

    trt_plugin.py registers with TensorRT when imported, so it cannot be imported here.
    """
    tree = ast.parse((plugin / "trt_plugin.py").read_text())
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    assert any(getattr(c.func, "attr", None) == "aot_kernel" for c in calls), "aot_impl must call aot_kernel"
    counts = [
        len(kw.value.elts)
        for c in calls
        if getattr(c.func, "id", None) == "launch"
        for kw in c.keywords
        if kw.arg == "scalars" and isinstance(kw.value, ast.List)
    ]
    where = f"{plugin.name}/trt_plugin.py"
    assert len(counts) == 1, f"{where}: write launch(..., scalars=[...]) once, with a list"
    return counts[0]


# --- the fresh interpreter (python tests/test_trt_aot_ptx.py OUT.json) ---


def main(out: Path) -> None:
    """Compile every case and the kernels that must be refused; write what the tests read to ``out``."""
    import triton
    from triton.backends.compiler import GPUTarget

    results: dict[str, Any] = {"ptxas": {sm: _ptxas_path(sm) for sm in {c.sm for c in CASES}}}
    for case in CASES:
        _, kernel = trt_plugin.load_plugin_folder(case.plugin / "trt_plugin.py")
        target = GPUTarget("cuda", case.sm, 32)
        results[str(case)] = _outcome(
            kernel.aot_kernel, case.dtype, **_aot_kernel_kwargs(case.plugin, kernel), target=target
        )
    for name, (fn, sm) in _refused_kernels().items():
        types = {"x_ptr": "fp32", "y_ptr": "fp32"}
        target = GPUTarget("cuda", sm, 32)
        results[name] = _outcome(aot_ptx.triton_ptx, triton.jit(fn), types, {"BLOCK": 64}, target)
    out.write_text(json.dumps(results))


def _refused_kernels() -> dict[str, tuple[Callable[..., None], int]]:
    """Kernels ``triton_ptx`` must refuse, with the SM to compile them for."""
    import triton.language as tl

    kernels: dict[str, tuple[Callable[..., None], int]] = {}
    if hasattr(tl, "make_tensor_descriptor"):

        def scratch_kernel(x_ptr, n, y_ptr, BLOCK: tl.constexpr):
            # a TMA descriptor built on the device lives in global scratch memory
            desc = tl.make_tensor_descriptor(x_ptr, shape=[n], strides=[1], block_shape=[BLOCK])
            offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(y_ptr + offsets, desc.load([tl.program_id(0) * BLOCK]), mask=offsets < n)

        kernels["scratch_kernel"] = (scratch_kernel, 90)

    def misordered_kernel(x_ptr, n, y_ptr, step, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offsets * step, mask=offsets < n)
        tl.store(y_ptr + offsets, x, mask=offsets < n)

    kernels["misordered_kernel"] = (misordered_kernel, 80)
    return kernels


def _outcome(compile_fn: Callable[..., TritonPtx], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """``compile_fn(*args, **kwargs)`` as JSON: the kernel's name, PTX and parameters, or the error."""
    try:
        ptx = compile_fn(*args, **kwargs)
    except PluginError as err:
        return {"error": str(err)}
    params = [[p.arg, p.kind, p.ptx.name, p.ptx.type] for p in ptx.params]
    return {"name": ptx.name, "ptx": ptx.ptx, "params": params, "hidden": list(ptx.hidden)}


def _ptxas_path(sm: int) -> str | None:
    """The ptxas Triton itself uses for this SM (3.9: ``get_ptxas``; earlier: ``knobs.nvidia.ptxas``)."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        return get_ptxas(sm).path
    except ImportError:
        pass
    try:
        from triton import knobs

        return knobs.nvidia.ptxas.path
    except (ImportError, AttributeError, RuntimeError):
        return None


# --- the tests ---


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What ``main`` wrote: one entry per case (by ``str(case)``) and per refused kernel, and ``ptxas``."""
    if importlib.util.find_spec("triton") is None:  # find_spec: importing Triton here would be interpreted
        pytest.skip("AOT kernels are compiled with Triton (the dev extra installs it)")
    return run_compiles(__file__, tmp_path_factory.mktemp("aot_ptx") / "compiled.json")


def _result(compiled: dict[str, Any], key: str) -> dict[str, Any]:
    result = compiled[key]
    assert "error" not in result, result.get("error")
    return result


def _entry_types(ptx: str, name: str) -> list[str]:
    """PTX types of the ``.entry name(...)`` parameters (read independently of gskit's parser)."""
    match = re.search(rf"\.entry\s+{re.escape(name)}\s*\((.*?)\)", ptx, re.DOTALL)
    assert match is not None, f"no .entry {name} in the PTX"
    return re.findall(r"\.param\s+\.(\w+)", match.group(1))


def test_every_shipped_plugin_has_aot_cases() -> None:
    """The discovery finds the shipped AOT plugins (a typo in it would silently test nothing)."""
    if os.environ.get("GSKIT_TEST_PLUGIN_ROOTS"):
        pytest.skip("plugin roots replaced by GSKIT_TEST_PLUGIN_ROOTS")
    names = {c.plugin.name for c in CASES}
    assert {"clamp_swish", "layer_norm", "rms_norm", "deform_conv2d"} <= names


@pytest.mark.parametrize("case", CASES, ids=str)
def test_entry_params_are_inputs_scalars_outputs(case: Case, compiled: dict[str, Any]) -> None:
    """(a) The entry takes the spec's inputs (u64), aot_impl's scalars (u32/s32), the spec's outputs (u64)."""
    spec = _spec(case.plugin)
    inputs, outputs = len(trt_plugin.input_names(spec)), len(spec.outputs)
    scalars = _aot_impl_scalar_count(case.plugin)
    result = _result(compiled, str(case))
    types = _entry_types(result["ptx"], result["name"])
    assert len(types) == inputs + scalars + outputs, types
    assert types[:inputs] == ["u64"] * inputs, types
    assert all(t in ("u32", "s32") for t in types[inputs : inputs + scalars]), types
    assert types[inputs + scalars :] == ["u64"] * outputs, types
    kinds = [kind for _, kind, _, _ in result["params"]]
    assert kinds == ["pointer"] * inputs + ["int32"] * scalars + ["pointer"] * outputs
    for hidden in result["hidden"]:
        assert not re.search(rf"\b{hidden}\b", result["ptx"]), f"dropped parameter {hidden} is still named"


@pytest.mark.parametrize("case", CASES, ids=str)
def test_edited_ptx_assembles(case: Case, compiled: dict[str, Any], tmp_path: Path) -> None:
    """(b) The PTX with the hidden parameters dropped assembles with Triton's ptxas for its SM."""
    ptxas = compiled["ptxas"][str(case.sm)]
    if ptxas is None:
        pytest.skip("this Triton names no ptxas")
    result = _result(compiled, str(case))
    target = re.search(r"^\s*\.target\s+(sm_\w+)", result["ptx"], re.MULTILINE)
    assert target is not None and target.group(1).startswith(f"sm_{case.sm}"), "PTX for another SM"
    source = tmp_path / f"{result['name']}.ptx"
    source.write_text(result["ptx"])
    done = subprocess.run(
        [ptxas, f"--gpu-name={target.group(1)}", str(source), "-o", str(tmp_path / "kernel.cubin")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_kernel_needing_global_scratch_is_refused(compiled: dict[str, Any]) -> None:
    """(c) A kernel building a TMA descriptor on the device needs global scratch: no AOT PTX for it."""
    if "scratch_kernel" not in compiled:
        pytest.skip("this Triton has no device-side tensor descriptors")
    assert re.match(
        r"scratch_kernel: the Triton kernel uses scratch memory \(\d+ bytes of global scratch.*\), which "
        r"TensorRT's AOT launcher cannot provide; register the plugin without aot_impl",
        compiled["scratch_kernel"].get("error", ""),
    ), compiled["scratch_kernel"]


def test_kernel_out_of_tensorrt_order_is_refused(compiled: dict[str, Any]) -> None:
    """Arguments (x, n, y, step): TensorRT passes every scalar before the outputs, so step gets y's slot."""
    assert re.match(
        r"misordered_kernel: TensorRT's AOT launcher passes \(input pointers, int32 scalars, output "
        r"pointers\); reorder the kernel's arguments "
        r"\(x_ptr: pointer, n: int32, y_ptr: pointer, step: int32\)",
        compiled["misordered_kernel"].get("error", ""),
    ), compiled["misordered_kernel"]


def _ptx(body: str, params: int = 5) -> str:
    types = ["u64 .ptr .global .align 1", "u32", "u64 .ptr .global .align 1", "u64", "u64"][:params]
    decls = ",\n".join(f"\t.param .{t} k_param_{i}" for i, t in enumerate(types))
    head = ".version 8.7\n.target sm_90a\n.address_size 64\n"
    return f"{head}.visible .entry k(\n{decls}\n)\n.reqntid 128\n{{\n{body}\n\tret;\n}}\n"


def test_unread_hidden_params_are_dropped() -> None:
    body = "\n".join(f"\tld.param.b64 %rd{i}, [k_param_{i}];" for i in range(3))
    ptx, params = aot_ptx.drop_hidden_params(_ptx(body), "k", 3, scratch={"global": 0, "profile": 0})
    assert [p.name for p in params] == [f"k_param_{i}" for i in range(5)]
    assert _entry_types(ptx, "k") == ["u64", "u32", "u64"]
    assert body in ptx and "k_param_3" not in ptx and "k_param_4" not in ptx


def test_ptx_without_hidden_params_is_unchanged() -> None:
    """Triton < 3.3 appends nothing: nothing is dropped."""
    source = _ptx("\tld.param.b64 %rd1, [k_param_0];", params=3)
    ptx, params = aot_ptx.drop_hidden_params(source, "k", 3, scratch={"global": 0, "profile": 0})
    assert ptx == source and len(params) == 3


def test_ptx_reading_a_hidden_param_is_refused() -> None:
    """(c) Triton says no scratch, but the body reads the global-scratch pointer: refused all the same."""
    source = _ptx("\tld.param.b64 %rd9, [k_param_3];")
    with pytest.raises(PluginError, match=r"^k: .*uses scratch memory \(reads k_param_3\).*without aot_impl"):
        aot_ptx.drop_hidden_params(source, "k", 3, scratch={"global": 0, "profile": 0})


def test_scratch_in_the_metadata_is_refused() -> None:
    with pytest.raises(PluginError, match=r"\(128 bytes of global scratch\)"):
        aot_ptx.drop_hidden_params(_ptx(""), "k", 3, scratch={"global": 128, "profile": 0})


def test_fewer_ptx_params_than_arguments_is_refused() -> None:
    with pytest.raises(PluginError, match="3 parameters for 4 kernel arguments"):
        aot_ptx.drop_hidden_params(_ptx("", params=3), "k", 4, scratch={})


def test_launch_refuses_a_wrong_scalar_count() -> None:
    """Checked before TensorRT is imported, so it runs on any machine."""
    params = tuple(
        KernelParam(arg, kind, PtxParam(f"k_param_{i}", "u64" if kind == "pointer" else "u32"))
        for i, (arg, kind) in enumerate([("x_ptr", "pointer"), ("n", "int32"), ("y_ptr", "pointer")])
    )
    ptx = TritonPtx("k", _ptx("", params=3), 128, 0, params, (), {"BLOCK": 1024})
    with pytest.raises(PluginError, match=r"^k: launch\(\) got 2 int32 scalars but the kernel takes 1 \(n\)"):
        trt_plugin.launch(ptx, grid=[1], scalars=[4, 5])


if __name__ == "__main__":
    main(Path(sys.argv[1]))
