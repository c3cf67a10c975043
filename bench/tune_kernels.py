"""Tune and time the plugin kernels on one CUDA GPU in a single run, and write the results as JSON.

The script a short GPU lease runs (issue 28). In order, each phase rewriting ``OUT/tune.json`` so that a run
cut short keeps what it measured:

1. device facts and the copy bandwidth (a 1 GiB device-to-device copy, bytes read + written);
2. every candidate launch configuration (``gskit.backends.row_launch.row_candidates`` for RMSNorm/LayerNorm,
   ``dcn_candidates`` for DeformConv2d) compiled and checked in parallel worker processes against a float64
   reference (torch for the norms, torchvision's ``deform_conv2d`` in float64 for DeformConv2d): relative
   error ``|out - ref| / |ref|`` (2-norms) on a NaN-poisoned output. The Triton cache they fill lets the
   timing phase compile nothing;
3. every checked configuration, ClampSwish and the baselines (PyTorch eager, torchvision) timed with
   ``triton.testing.do_bench`` (median; L2 flushed before each run, so inputs come from device memory):
   per shape the fastest configuration and the shipped rule's pick, with their ratios to the bandwidth
   floor (bytes read + written / copy bandwidth) and to the baseline. Baselines are timed twice (before and
   after the candidates): their difference is the run's noise;
4. per-call wall time of the shipped wrappers and of eager on the 1- and 64-row shapes (200 calls, one
   synchronize): the Python launch overhead a JIT user pays, which device timing leaves out;
5. the C++ plugin's CUDA kernel (``cpp/check_kernel_cuda.cu`` built with nvcc) on the DeformConv2d shapes:
   error against torchvision float64 and median time;
6. the norm kernels' AOT PTX (what TensorRT launches), loaded with CuPy, against the JIT kernel: as shipped
   and with 16-byte alignment promised (``triton_ptx(divisible_by_16=...)``).

Run: ``python bench/tune_kernels.py --out DIR [--workers 16] [--budget 330]`` (CUDA GPU, torch, Triton;
torchvision, CuPy and nvcc for their phases). ``--smoke`` runs phases 2-3 on a CPU with Triton's interpreter,
tiny shapes and two candidates each (the rule's pick and one other): a check of the script itself
(tests/test_bench_eager.py), whose times
mean nothing. The README's kernel performance rows summarise a run's JSON (bench/gpu_runs/).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

#: What ``--only`` chooses from (all by default).
PHASES = ("norm", "clamp_swish", "dcn", "launch_overhead", "cpp", "aot")
NORM_COLS = (768, 4096, 8192, 11008)
NORM_ROWS = (1, 64, 16384)
NORM_DTYPES = ("float32", "float16", "bfloat16")
#: A memory-bound kernel may take at most this many times its bandwidth floor on the large shapes.
FLOOR_GOAL = 1.3
#: Rows of the norms' correctness check (no multiple of any rows-per-program > 1).
CHECK_ROWS = 37
#: Relative error allowed in the correctness checks, by dtype (float32 accumulation in every kernel).
REL_TOLERANCE = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


@dataclass(frozen=True)
class DcnShape:
    """One DeformConv2d benchmark shape (torchvision takes symmetric pads only)."""

    name: str
    x: tuple[int, int, int, int]
    c_out: int
    kernel: int = 3
    pad: int = 1
    stride: int = 1
    group: int = 1
    offset_group: int = 1
    mask: bool = True
    bias: bool = True

    @property
    def out_hw(self) -> tuple[int, int]:
        return tuple((s + 2 * self.pad - self.kernel) // self.stride + 1 for s in self.x[2:])  # type: ignore[return-value]

    def attrs(self) -> dict[str, Any]:
        return {
            "strides": [self.stride] * 2,
            "pads": [self.pad] * 4,
            "dilations": [1, 1],
            "group": self.group,
            "offset_group": self.offset_group,
        }


DCN_SHAPES = (
    # The corpus: the seed's model (torchvision DeformConv2d(3, 3, 3) on 1x3x5x5, DCNv1),
    # scripts/export_cases.py's DeformConv (1x3x7x7, 4 outputs, pad 1, DCNv1), tests/exported_models.py's
    # DCNv2 (2x4x6x5, 6 outputs, mask).
    DcnShape("seed-dcnv1", (1, 3, 5, 5), 3, pad=0, mask=False),
    DcnShape("export-cases-dcnv1", (1, 3, 7, 7), 4, mask=False),
    DcnShape("exported-dcnv2", (2, 4, 6, 5), 6),
    # DCNv2 in ResNet-50's 3x3 bottleneck convolutions (stages c3-c5), batch 8 at 224x224, and c4 at a
    # detection input (800x1088, stride 16), batch 2.
    DcnShape("r50-c3-dcnv2", (8, 128, 28, 28), 128),
    DcnShape("r50-c4-dcnv2", (8, 256, 14, 14), 256),
    DcnShape("r50-c5-dcnv2", (8, 512, 7, 7), 512),
    DcnShape("r50-c4-det-dcnv2", (2, 256, 50, 68), 256),
)
SMOKE_DCN_SHAPES = (DcnShape("smoke-dcnv2", (1, 6, 5, 4), 5, group=1, offset_group=2),)


@dataclass
class Run:
    """What the run has measured so far, written as JSON after every phase."""

    out: Path
    smoke: bool
    budget_s: float
    started: float = field(default_factory=time.monotonic)
    data: dict[str, Any] = field(default_factory=dict)

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)

    def save(self) -> None:
        self.data["elapsed_s"] = round(time.monotonic() - self.started, 1)
        tmp = self.out / "tune.json.tmp"
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.out / "tune.json")


def log(message: str) -> None:
    print(message, flush=True)


# --- inputs and references (used by the worker processes and the main one) ---


def norm_inputs(kernel: str, dtype: str, rows: int, cols: int, device: str, seed: int = 0) -> list[Any]:
    """x, weight(, bias) for a norm kernel; x with a large mean for LayerNorm (tests the centred variance)."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed * 1_000_003 + rows * 7919 + cols)
    torch_dtype = getattr(torch, dtype)
    shift = 20.0 if kernel == "layer_norm" else 1.0
    x = torch.randn(rows, cols, generator=gen) * 3 + shift
    params = [torch.randn(cols, generator=gen) for _ in range(2 if kernel == "layer_norm" else 1)]
    return [t.to(device=device, dtype=torch_dtype) for t in (x, *params)]


def norm_reference(kernel: str, tensors: list[Any]) -> Any:
    """The norm in float64 (independent of the kernels: torch's own ops)."""
    import torch.nn.functional as F

    x, *params = (t.double() for t in tensors)
    if kernel == "layer_norm":
        return F.layer_norm(x, (x.shape[-1],), params[0], params[1], eps=1e-5)
    return x / (x.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt() * params[0]


def norm_fn(kernel: str) -> Callable[..., Any]:
    if kernel == "layer_norm":
        from plugins.layer_norm.kernel import layer_norm

        return layer_norm
    from plugins.rms_norm.kernel import rms_norm

    return rms_norm


def norm_eager(kernel: str, tensors: list[Any]) -> Callable[[], Any]:
    import torch.nn.functional as F

    x, *params = tensors
    if kernel == "layer_norm":
        return lambda: F.layer_norm(x, (x.shape[-1],), params[0], params[1], eps=1e-5)
    return lambda: F.rms_norm(x, (x.shape[-1],), params[0], eps=1e-5)


def dcn_inputs(shape: DcnShape, dtype: str, device: str, seed: int = 0) -> dict[str, Any]:
    """x, weight, offset, bias, mask (None when the shape has none) in ``dtype``."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed * 1_000_003 + sum(shape.x) + shape.c_out)
    n, c, _, _ = shape.x
    oh, ow = shape.out_hw
    taps = shape.kernel * shape.kernel
    tensors = {
        "x": torch.randn(shape.x, generator=gen),
        "weight": torch.randn(shape.c_out, c // shape.group, shape.kernel, shape.kernel, generator=gen)
        / (c // shape.group * taps) ** 0.5,
        # Offsets of a few pixels: samples between pixels, on the border and outside the image.
        "offset": torch.randn(n, 2 * shape.offset_group * taps, oh, ow, generator=gen) * 2,
        "bias": torch.randn(shape.c_out, generator=gen) if shape.bias else None,
        "mask": torch.rand(n, shape.offset_group * taps, oh, ow, generator=gen) if shape.mask else None,
    }
    torch_dtype = getattr(torch, dtype)
    return {k: None if t is None else t.to(device=device, dtype=torch_dtype) for k, t in tensors.items()}


def dcn_torchvision(shape: DcnShape, t: dict[str, Any]) -> Callable[[], Any]:
    """torchvision's deform_conv2d on the same tensors (groups from the weight and offset shapes)."""
    from torchvision.ops import deform_conv2d

    return lambda: deform_conv2d(
        t["x"], t["offset"], t["weight"], t["bias"], stride=shape.stride, padding=shape.pad, mask=t["mask"]
    )


def dcn_reference(shape: DcnShape, t: dict[str, Any]) -> Any:
    """DeformConv2d in float64: torchvision on the GPU, or (no torchvision, the smoke run) bench/eager.py."""
    t64 = {k: None if v is None else v.double() for k, v in t.items()}
    try:
        return dcn_torchvision(shape, t64)()
    except ImportError:
        from bench.eager import deform_conv2d

        return deform_conv2d(
            t64["x"], t64["weight"], t64["offset"], t64["bias"], t64["mask"], **shape.attrs()
        )


def rel_error(out: Any, ref: Any) -> float:
    """``|out - ref| / |ref|`` in float64 (inf when out has a NaN: an unwritten or broken element)."""
    out64 = out.double()
    if not bool(out64.isfinite().all()):
        return float("inf")
    return float((out64 - ref).norm() / ref.norm().clamp_min(1e-30))


# --- phase 2: compile and check in worker processes ---


def check_job(job: dict[str, Any]) -> dict[str, Any]:
    """Compile and check one configuration (a worker process); returns the job with its error or failure."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    started = time.perf_counter()
    try:
        if job["kind"] == "norm":
            from gskit.backends.row_launch import RowLaunch

            tensors = norm_inputs(job["kernel"], job["dtype"], CHECK_ROWS, job["cols"], device)
            out = torch.full_like(tensors[0], float("nan"))
            norm_fn(job["kernel"])(*tensors, out, epsilon=1e-5, launch=RowLaunch(**job["launch"]))
            error = rel_error(out, norm_reference(job["kernel"], tensors))
        elif job["kind"] == "dcn":
            from plugins.deform_conv2d.kernel import DcnLaunch, deform_conv2d

            shape = DcnShape(**job["shape"])
            t = dcn_inputs(shape, job["dtype"], device)
            n, _, _, _ = shape.x
            out = torch.full((n, shape.c_out, *shape.out_hw), float("nan"), dtype=t["x"].dtype, device=device)
            deform_conv2d(
                t["x"], t["weight"], t["offset"], t["bias"], t["mask"], out,
                **shape.attrs(), launch=DcnLaunch(**job["launch"]),
            )  # fmt: skip
            error = rel_error(out, dcn_reference(shape, t))
        else:  # "aot": the norm kernels' TensorRT PTX
            return {**job, **aot_ptx(job)}
        if device == "cuda":
            torch.cuda.synchronize()
        ok = error <= REL_TOLERANCE[job["dtype"]]
        return {**job, "rel_error": error, "ok": ok, "check_s": round(time.perf_counter() - started, 2)}
    except Exception as err:  # a configuration that fails to compile or run is recorded, not fatal
        return {**job, "ok": False, "failure": f"{type(err).__name__}: {str(err)[:800]}"}


def aot_ptx(job: dict[str, Any]) -> dict[str, Any]:
    """The AOT PTX of a norm kernel for the shipped rule, as shipped or with 16-byte alignment promised."""
    from gskit.backends.aot_ptx import triton_ptx
    from gskit.backends.row_launch import row_constexprs, row_launch

    module = __import__(f"plugins.{job['kernel']}.kernel", fromlist=["kernel"])
    kernel = getattr(module, f"{job['kernel']}_kernel")
    triton_type = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}[job["dtype"]]
    launch = row_launch(job["cols"], 4 if job["dtype"] == "float32" else 2)
    pointers = [a for a in kernel.arg_names if a.endswith("_ptr")]
    hints = [*pointers, "cols"] if job["aligned"] and job["cols"] % 16 == 0 else []
    ptx = triton_ptx(
        kernel, dict.fromkeys(pointers, triton_type), row_constexprs(launch, 1e-5),
        num_warps=launch.num_warps, divisible_by_16=hints,
    )  # fmt: skip
    return {
        "ok": True, "name": ptx.name, "ptx": ptx.ptx, "block_x": ptx.block_x, "shared_mem": ptx.shared_mem,
        "rows_per_program": launch.rows, "v4_loads": ptx.ptx.count("ld.global.v4"),
    }  # fmt: skip


def norm_jobs(smoke: bool) -> list[dict[str, Any]]:
    from gskit.backends.row_launch import row_candidates, row_launch

    jobs = []
    cols_list = (77, 1030) if smoke else NORM_COLS
    for kernel in ("rms_norm", "layer_norm"):
        for dtype in ("float32",) if smoke else NORM_DTYPES:
            itemsize = 4 if dtype == "float32" else 2
            for cols in cols_list:
                candidates = row_candidates(cols, itemsize)
                if smoke:  # the rule's pick and one other
                    rule = row_launch(cols, itemsize)
                    candidates = [rule, next(c for c in candidates if c != rule)]
                for launch in candidates:
                    jobs.append(
                        {
                            "kind": "norm",
                            "kernel": kernel,
                            "dtype": dtype,
                            "cols": cols,
                            "launch": asdict(launch),
                        }
                    )
    return jobs


def dcn_jobs(smoke: bool) -> list[dict[str, Any]]:
    from plugins.deform_conv2d.kernel import dcn_candidates, dcn_launch

    jobs = []
    for shape in SMOKE_DCN_SHAPES if smoke else DCN_SHAPES:
        for dtype in ("float32",) if smoke else ("float32", "float16"):
            itemsize = 4 if dtype == "float32" else 2
            channels = (shape.c_out // shape.group, shape.x[1] // shape.group, itemsize)
            candidates = dcn_candidates(*channels)
            if smoke:  # the rule's pick and one other
                rule = dcn_launch(*channels)
                candidates = [rule, next(c for c in candidates if c != rule)]
            for launch in candidates:
                jobs.append({"kind": "dcn", "shape": asdict(shape), "dtype": dtype, "launch": asdict(launch)})
    return jobs


def aot_jobs() -> list[dict[str, Any]]:
    return [
        {"kind": "aot", "kernel": kernel, "dtype": dtype, "cols": cols, "aligned": aligned}
        for kernel in ("rms_norm", "layer_norm")
        for dtype in ("float32", "float16")
        for cols in NORM_COLS
        for aligned in (False, True)
    ]


def run_jobs(jobs: list[dict[str, Any]], workers: int, smoke: bool) -> list[dict[str, Any]]:
    """Every job through :func:`check_job`: in ``workers`` spawned processes on a GPU, else in-process."""
    if smoke or workers <= 1:
        return [check_job(job) for job in jobs]
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        # Slow compiles (large DeformConv2d tiles) first, so that no worker is left with them at the end.
        order = sorted(range(len(jobs)), key=lambda i: jobs[i]["kind"] != "dcn")
        futures = {pool.submit(check_job, jobs[i]): i for i in order}
        results: list[dict[str, Any] | None] = [None] * len(jobs)
        for future in concurrent.futures.as_completed(futures):
            index = futures[future]
            try:
                results[index] = future.result()
            except Exception as err:  # a crashed worker (e.g. an illegal address kills its CUDA context)
                results[index] = {
                    **jobs[index],
                    "ok": False,
                    "failure": f"worker: {type(err).__name__}: {err}",
                }
    return [r for r in results if r is not None]


# --- timing ---


def timer(smoke: bool) -> Callable[[Callable[[], Any]], float]:
    """Median milliseconds of a callable: do_bench on a GPU (L2 flushed), wall time in the smoke run."""
    if smoke:

        def wall(fn: Callable[[], Any]) -> float:
            fn()
            times = []
            for _ in range(3):
                start = time.perf_counter()
                fn()
                times.append((time.perf_counter() - start) * 1e3)
            return statistics.median(times)

        return wall
    from triton.testing import do_bench

    return lambda fn: float(do_bench(fn, warmup=10, rep=40, return_mode="median"))


def copy_bandwidth(bench: Callable[[Callable[[], Any]], float], device: str, nbytes: int) -> float:
    """Bytes per millisecond of a device-to-device copy (read + write counted)."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * nbytes / bench(partial(dst.copy_, src))


def nbytes(*tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def launch_key(launch: dict[str, Any]) -> str:
    return "-".join(f"{k}{v}" for k, v in launch.items())


def time_norms(run: Run, checked: list[dict[str, Any]], bench: Callable[..., float], device: str) -> None:
    import torch

    from gskit.backends.row_launch import RowLaunch, row_launch

    peak = run.data["copy_bytes_per_ms"]
    rows_list = (1, 5) if run.smoke else NORM_ROWS
    results = run.data.setdefault("norm", [])
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for job in checked:
        if job["kind"] == "norm" and job.get("ok"):
            groups.setdefault((job["kernel"], job["dtype"], job["cols"]), []).append(job)
    for (kernel, dtype, cols), jobs in sorted(groups.items()):
        fn = norm_fn(kernel)
        itemsize = 4 if dtype == "float32" else 2
        rule = asdict(row_launch(cols, itemsize))
        for rows in rows_list:
            tensors = norm_inputs(kernel, dtype, rows, cols, device, seed=1)
            out = torch.empty_like(tensors[0])
            eager = norm_eager(kernel, tensors)
            row: dict[str, Any] = {"kernel": kernel, "dtype": dtype, "cols": cols, "rows": rows}
            row["floor_ms"] = nbytes(*tensors, out) / peak
            row["eager_ms"] = bench(eager)
            configs = []
            for job in jobs:
                launch = RowLaunch(**job["launch"])
                ms = bench(partial(fn, *tensors, out, epsilon=1e-5, launch=launch))
                configs.append({**job["launch"], "ms": ms, "rel_error": job["rel_error"]})
            row["eager_ms_again"] = bench(eager)
            row["configs"] = configs
            best = min(configs, key=lambda c: c["ms"])
            row["best"] = best
            row["rule"] = next(
                (c for c in configs if launch_key({k: c[k] for k in rule}) == launch_key(rule)), None
            )
            for label in ("best", "rule"):
                if row[label]:
                    row[f"{label}_over_floor"] = row[label]["ms"] / row["floor_ms"]
                    row[f"{label}_over_eager"] = row[label]["ms"] / min(
                        row["eager_ms"], row["eager_ms_again"]
                    )
            results.append(row)
            log(
                f"{kernel:<10} {dtype:<8} {rows:>5}x{cols:<5} floor {row['floor_ms']:.4f} "
                f"eager {row['eager_ms']:.4f}"
                f" best {best['ms']:.4f} ({launch_key({k: best[k] for k in rule})})"
            )
        run.save()


def time_clamp_swish(run: Run, bench: Callable[..., float], device: str) -> None:
    import torch
    import torch.nn.functional as F

    from plugins.clamp_swish.kernel import clamp_swish

    peak = run.data["copy_bytes_per_ms"]
    rows = []
    for dtype in ("float32",) if run.smoke else ("float32", "float16", "bfloat16"):
        x = torch.randn(
            (3, 17, 33) if run.smoke else (64, 1024, 1024), dtype=getattr(torch, dtype), device=device
        )
        y = torch.full_like(x, float("nan"))
        clamp_swish(x, y)
        ref = F.silu(x.double().clamp(min=0))
        row = {"dtype": dtype, "shape": list(x.shape), "rel_error": rel_error(y, ref)}
        row["floor_ms"] = nbytes(x, y) / peak
        row["ms"] = bench(lambda x=x, y=y: clamp_swish(x, y))
        row["eager_ms"] = bench(lambda x=x: F.silu(x.clamp(min=0)))
        row["over_floor"] = row["ms"] / row["floor_ms"]
        row["over_eager"] = row["ms"] / row["eager_ms"]
        rows.append(row)
    run.data["clamp_swish"] = rows
    run.save()


def time_dcn(run: Run, checked: list[dict[str, Any]], bench: Callable[..., float], device: str) -> None:
    import torch

    from bench.eager import deform_conv2d as eager_deform_conv2d
    from plugins.deform_conv2d.kernel import DcnLaunch, dcn_launch, deform_conv2d

    results = run.data.setdefault("dcn", [])
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for job in checked:
        if job["kind"] == "dcn":
            groups.setdefault((job["shape"]["name"], job["dtype"]), []).append(job)
    shapes = {s.name: s for s in (SMOKE_DCN_SHAPES if run.smoke else DCN_SHAPES)}
    for (name, dtype), jobs in groups.items():
        shape = shapes[name]
        t = dcn_inputs(shape, dtype, device, seed=1)
        args = (t["x"], t["weight"], t["offset"], t["bias"], t["mask"])
        n = shape.x[0]
        out = torch.empty((n, shape.c_out, *shape.out_hw), dtype=t["x"].dtype, device=device)
        itemsize = 4 if dtype == "float32" else 2
        rule = asdict(dcn_launch(shape.c_out // shape.group, shape.x[1] // shape.group, itemsize))
        row: dict[str, Any] = {"shape": asdict(shape), "dtype": dtype}
        baselines: dict[str, Callable[[], Any]] = {
            "eager": partial(eager_deform_conv2d, *args, **shape.attrs())
        }
        try:
            baselines["torchvision"] = dcn_torchvision(shape, t)
            ref = dcn_reference(shape, t)
            row["torchvision_rel_error"] = rel_error(baselines["torchvision"](), ref)
        except ImportError:
            pass
        for label, fn in baselines.items():
            row[f"{label}_ms"] = bench(fn)
        configs = []
        for job in jobs:
            entry = {**job["launch"], "rel_error": job.get("rel_error"), "ok": job.get("ok")}
            if job.get("ok"):
                launch = DcnLaunch(**job["launch"])
                entry["ms"] = bench(partial(deform_conv2d, *args, out, **shape.attrs(), launch=launch))
            else:
                entry["failure"] = job.get("failure")
            configs.append(entry)
        for label, fn in baselines.items():
            row[f"{label}_ms_again"] = bench(fn)
        row["configs"] = configs
        timed = [c for c in configs if "ms" in c]
        if timed:
            row["best"] = min(timed, key=lambda c: c["ms"])
            row["rule"] = next(
                (c for c in timed if launch_key({k: c[k] for k in rule}) == launch_key(rule)), None
            )
            base = "torchvision" if "torchvision_ms" in row else "eager"
            base_ms = min(row[f"{base}_ms"], row[f"{base}_ms_again"])
            row["baseline"] = base
            for label in ("best", "rule"):
                if row.get(label):
                    row[f"{label}_over_{base}"] = row[label]["ms"] / base_ms
            log(
                f"DeformConv2d {name:<18} {dtype:<8} {base} {base_ms:.4f} best {row['best']['ms']:.4f} "
                f"({launch_key({k: row['best'][k] for k in rule})})"
            )
        results.append(row)
        run.save()


def launch_overhead(run: Run, device: str) -> None:
    """Wall time per call of 200 back-to-back calls: the shipped wrappers against eager, small shapes."""
    import torch

    rows_out = []
    for kernel in ("rms_norm", "layer_norm"):
        fn = norm_fn(kernel)
        for cols in NORM_COLS:
            for rows in (1, 64):
                tensors = norm_inputs(kernel, "float16", rows, cols, device, seed=2)
                out = torch.empty_like(tensors[0])
                row = {"kernel": kernel, "dtype": "float16", "rows": rows, "cols": cols}
                for label, call in (
                    ("gskit", partial(fn, *tensors, out, epsilon=1e-5)),
                    ("eager", norm_eager(kernel, tensors)),
                ):
                    for _ in range(20):
                        call()
                    torch.cuda.synchronize()
                    start = time.perf_counter()
                    for _ in range(200):
                        call()
                    torch.cuda.synchronize()
                    row[f"{label}_us_per_call"] = (time.perf_counter() - start) / 200 * 1e6
                rows_out.append(row)
    run.data["launch_overhead"] = rows_out
    run.save()


# --- phase 5: the C++ CUDA kernel ---


def start_cpp_build(out_dir: Path) -> tuple[subprocess.Popen | None, Path]:
    """Start nvcc on the harness in the background (it overlaps the Triton compiles)."""
    from plugins.deform_conv2d.test_cpp_kernel_cuda import CPP_DIR, SOURCES, _nvcc

    exe = out_dir / "check_kernel_cuda"
    nvcc = _nvcc()
    if nvcc is None:
        return None, exe
    command = [
        nvcc,
        "-std=c++17",
        "-O3",
        "-arch=sm_90",
        "-I",
        str(CPP_DIR),
        *(str(CPP_DIR / s) for s in SOURCES),
    ]
    return subprocess.Popen([*command, "-o", str(exe)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT), exe


def run_cpp(run: Run, build: subprocess.Popen | None, exe: Path, device: str) -> None:
    import numpy as np
    import torch

    if build is None:
        run.data["cpp"] = {"skipped": "no nvcc"}
        run.save()
        return
    output = build.communicate(timeout=300)[0].decode(errors="replace")
    if build.returncode != 0:
        run.data["cpp"] = {"build_failed": output[-3000:]}
        run.save()
        return
    rows = []
    for shape in DCN_SHAPES:
        for dtype, flag in (("float32", "f32"), ("float16", "f16")):
            if run.left() < 20:
                rows.append({"shape": shape.name, "dtype": dtype, "skipped": "time"})
                continue
            t = dcn_inputs(shape, dtype, device, seed=3)
            with tempfile.TemporaryDirectory() as folder:
                for name, tensor in t.items():
                    if tensor is not None:
                        tensor.float().cpu().numpy().tofile(Path(folder) / f"{name}.f32")
                n, c, h, w = shape.x
                oh, ow = shape.out_hw
                k = shape.kernel
                sizes = [
                    n,
                    c,
                    h,
                    w,
                    shape.c_out,
                    k,
                    k,
                    oh,
                    ow,
                    shape.stride,
                    shape.stride,
                    shape.pad,
                    shape.pad,
                ]
                sizes += [1, 1, shape.group, shape.offset_group, int(shape.bias), int(shape.mask)]
                reps = 10 if shape.x[1] >= 128 else 50
                done = subprocess.run(
                    [str(exe), folder, flag, *map(str, sizes), str(reps)],
                    capture_output=True, text=True, timeout=120, check=False,
                )  # fmt: skip
                row: dict[str, Any] = {"shape": shape.name, "dtype": dtype, "rc": done.returncode}
                if done.returncode != 0:
                    row["stderr"] = done.stderr[-1000:]
                else:
                    y = np.fromfile(Path(folder) / "y.f32", dtype=np.float32).reshape(n, shape.c_out, oh, ow)
                    got = torch.from_numpy(y).to(device)
                    row["rel_error"] = rel_error(got, dcn_reference(shape, t))
                    row["ms"] = float(done.stdout.split("median_ms")[1].split()[0])
            rows.append(row)
    run.data["cpp"] = rows
    run.save()


# --- phase 6: the AOT PTX through CuPy ---


def time_aot(run: Run, ptxs: list[dict[str, Any]], bench: Callable[..., float], device: str) -> None:
    import cupy
    import numpy as np
    import torch

    rows = []
    for job in ptxs:
        row = {k: job[k] for k in ("kernel", "dtype", "cols", "aligned")}
        if not job.get("ok"):
            rows.append({**row, "failure": job.get("failure")})
            continue
        with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as handle:
            handle.write(job["ptx"])
        function = cupy.RawModule(path=handle.name).get_function(job["name"])
        os.unlink(handle.name)
        rows_n = 16384
        tensors = norm_inputs(job["kernel"], job["dtype"], rows_n, job["cols"], device, seed=4)
        out = torch.full_like(tensors[0], float("nan"))
        pointers = [cupy.asarray(t) for t in (*tensors, out)]
        args = (*pointers[:-1], np.int32(rows_n), np.int32(job["cols"]), pointers[-1])
        grid = (-(-rows_n // job["rows_per_program"]),)

        def call(function=function, grid=grid, args=args, job=job) -> None:
            function(grid, (job["block_x"],), args, shared_mem=job["shared_mem"])

        call()
        torch.cuda.synchronize()
        jit_out = norm_fn(job["kernel"])(*tensors, epsilon=1e-5)
        row["max_abs_diff_jit"] = float((out.float() - jit_out.float()).abs().max())
        row["v4_loads"] = job["v4_loads"]
        row["aot_ms"] = bench(call)
        row["jit_ms"] = bench(partial(norm_fn(job["kernel"]), *tensors, epsilon=1e-5))
        row["aot_over_jit"] = row["aot_ms"] / row["jit_ms"]
        rows.append(row)
    run.data["aot"] = rows
    run.save()


def rule_picks(data: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per shape of a run's sweep: the configuration the rules of this checkout pick, and the fastest.

    The rules (``row_launch``, ``dcn_launch``; for DeformConv2d also ``fused_launch``, the AOT kernel's, under
    ``aot_*``) are read off a sweep; this recomputes their picks from the sweep's own timings, so the numbers
    belong to the shipped rules even when the run timed them as one candidate among others. A pick the sweep
    did not time shows as ``ms: None``.
    """
    from gskit.backends.row_launch import row_launch
    from plugins.deform_conv2d.kernel import dcn_launch, fused_launch

    def pick(configs: list[dict[str, Any]], rule: dict[str, Any]) -> dict[str, Any] | None:
        # A field added after the run (DcnLaunch.method) has its default value in the run's configurations.
        defaults = {"method": "fused"}
        return next(
            (
                c
                for c in configs
                if "ms" in c and all(c.get(k, defaults.get(k)) == v for k, v in rule.items())
            ),
            None,
        )

    norms = []
    for r in data.get("norm", []):
        rule = asdict(row_launch(r["cols"], 4 if r["dtype"] == "float32" else 2))
        chosen = pick(r["configs"], rule)
        eager = min(r["eager_ms"], r["eager_ms_again"])
        entry = {k: r[k] for k in ("kernel", "dtype", "rows", "cols", "floor_ms")}
        entry.update(eager_ms=eager, best_ms=r["best"]["ms"], rule=rule, ms=chosen and chosen["ms"])
        if chosen:
            entry.update(over_floor=chosen["ms"] / r["floor_ms"], over_eager=chosen["ms"] / eager)
        norms.append(entry)
    dcns = []
    for r in data.get("dcn", []):
        shape = r["shape"]
        itemsize = 4 if r["dtype"] == "float32" else 2
        channels = (shape["c_out"] // shape["group"], shape["x"][1] // shape["group"], itemsize)
        rule = asdict(dcn_launch(*channels))
        chosen = pick(r["configs"], rule)
        aot = pick(r["configs"], asdict(fused_launch(*channels)))
        base = r.get("baseline", "eager")
        base_ms = min(r[f"{base}_ms"], r[f"{base}_ms_again"])
        entry = {"shape": shape["name"], "dtype": r["dtype"], "baseline": base, "baseline_ms": base_ms}
        entry.update(best_ms=r["best"]["ms"] if "best" in r else None, rule=rule, ms=chosen and chosen["ms"])
        entry["aot_ms"] = aot and aot["ms"]
        if chosen:
            entry[f"over_{base}"] = chosen["ms"] / base_ms
        if aot:
            entry[f"aot_over_{base}"] = aot["ms"] / base_ms
        dcns.append(entry)
    return {"norm": norms, "dcn": dcns}


#: The committed runs (``bench/gpu_runs/``), oldest first: ``--summarize``'s default.
COMMITTED_RUNS = ("h100-2026-11-27", "h100-2026-11-27-dcn")


def newest_picks(runs: list[tuple[str, dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """:func:`rule_picks` over runs (``(label, data)``, oldest first): per shape, the newest run's row.

    A later run that swept a shape again (another candidate set, other code) replaces the earlier rows of
    that shape; each row names its run under ``run``. Rows keep the order in which their shapes first appear.
    """
    keys = {"norm": ("kernel", "dtype", "rows", "cols"), "dcn": ("shape", "dtype")}
    merged: dict[str, dict[tuple[Any, ...], dict[str, Any]]] = {kind: {} for kind in keys}
    for label, data in runs:
        for kind, rows in rule_picks(data).items():
            for row in rows:
                merged[kind][tuple(row[k] for k in keys[kind])] = {"run": label, **row}
    return {kind: list(rows.values()) for kind, rows in merged.items()}


def summary(run: Run) -> None:
    """The short table printed last (the lease's reply shows the end of the output)."""
    log("\n== norms: shipped rule (best) ms, /floor, /eager ==")
    for r in run.data.get("norm", []):
        rule = r.get("rule") or {}
        log(
            f"{r['kernel'][:5]} {r['dtype'][:5]} {r['rows']:>5}x{r['cols']:<5} "
            f"rule {rule.get('ms', float('nan')):.4f} best {r['best']['ms']:.4f} "
            f"/floor {r.get('rule_over_floor', float('nan')):.2f} ({r['best_over_floor']:.2f}) "
            f"/eager {r.get('rule_over_eager', float('nan')):.2f} ({r['best_over_eager']:.2f})"
        )
    for r in run.data.get("clamp_swish", []):
        log(
            f"ClampSwish {r['dtype']} /floor {r['over_floor']:.2f} /eager {r['over_eager']:.2f} "
            f"err {r['rel_error']:.1e}"
        )
    log("== DeformConv2d: rule (best) over baseline ==")
    for r in run.data.get("dcn", []):
        if "best" in r:
            base = r["baseline"]
            log(
                f"{r['shape']['name']:<18} {r['dtype']:<8} {base} {r[base + '_ms']:.4f} "
                f"rule {r.get('rule_over_' + base, float('nan')):.2f} best {r['best_over_' + base]:.2f}"
            )
    failures = [j for j in run.data.get("checks", []) if not j.get("ok")]
    log(f"checks: {len(run.data.get('checks', []))} run, {len(failures)} failed")
    for j in failures[:10]:
        log(f"  FAILED {json.dumps({k: v for k, v in j.items() if k != 'ptx'})[:300]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="folder for tune.json")
    parser.add_argument(
        "--summarize",
        type=Path,
        nargs="*",
        metavar="JSON",
        help="print the shipped rules' picks, per shape from the newest of these runs' tune.json (oldest "
        f"first; default: bench/gpu_runs/{{{','.join(COMMITTED_RUNS)}}}/tune.json)",
    )
    parser.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1))
    parser.add_argument(
        "--budget", type=float, default=330.0, help="seconds; late phases are skipped past it"
    )
    parser.add_argument("--smoke", action="store_true", help="check the script on a CPU (Triton interpreter)")
    parser.add_argument(
        "--only",
        default=",".join(PHASES),
        help=f"comma-separated phases to run (default: all of {','.join(PHASES)})",
    )
    args = parser.parse_args(argv)
    only = set(args.only.split(","))
    if only - set(PHASES):
        parser.error(
            f"--only: unknown phases {','.join(sorted(only - set(PHASES)))}; known: {','.join(PHASES)}"
        )
    if args.summarize is not None:
        committed = [REPO / "bench" / "gpu_runs" / name / "tune.json" for name in COMMITTED_RUNS]
        paths = args.summarize or committed
        runs = [(path.parent.name, json.loads(path.read_text())) for path in paths]
        print(json.dumps(newest_picks(runs), indent=1))
        return 0
    if args.out is None:
        parser.error("--out is required (or --summarize)")
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported
    import torch

    if not args.smoke and not torch.cuda.is_available():
        print("bench/tune_kernels.py needs a CUDA GPU (or --smoke)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    run = Run(args.out, args.smoke, args.budget)
    device = "cpu" if args.smoke else "cuda"
    import triton

    run.data.update({
        "device": "cpu (smoke run: times mean nothing)" if args.smoke else torch.cuda.get_device_name(),
        "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "triton": triton.__version__,
    })  # fmt: skip
    build, exe = (None, args.out / "none") if args.smoke or "cpp" not in only else start_cpp_build(args.out)
    bench = timer(args.smoke)
    run.data["copy_bytes_per_ms"] = copy_bandwidth(bench, device, 1 << 20 if args.smoke else 1 << 30)
    run.data["copy_GBps"] = run.data["copy_bytes_per_ms"] / 1e6
    log(f"{run.data['device']}: copy {run.data['copy_GBps']:.0f} GB/s")
    jobs = (norm_jobs(args.smoke) if "norm" in only else []) + (dcn_jobs(args.smoke) if "dcn" in only else [])
    jobs += aot_jobs() if "aot" in only and not args.smoke else []
    started = time.perf_counter()
    checked = run_jobs(jobs, args.workers, args.smoke)
    run.data["checks"] = [{k: v for k, v in j.items() if k != "ptx"} for j in checked]
    run.data["check_phase_s"] = round(time.perf_counter() - started, 1)
    log(f"{len(checked)} configurations compiled and checked in {run.data['check_phase_s']} s")
    run.save()
    if "norm" in only:
        time_norms(run, checked, bench, device)
    if "clamp_swish" in only:
        time_clamp_swish(run, bench, device)
    if "dcn" in only:
        time_dcn(run, checked, bench, device)
    if not args.smoke:
        for label, phase in (
            ("launch_overhead", lambda: launch_overhead(run, device)),
            ("cpp", lambda: run_cpp(run, build, exe, device)),
            ("aot", lambda: time_aot(run, [j for j in checked if j["kind"] == "aot"], bench, device)),
        ):
            if label not in only:
                continue
            if run.left() < 15:
                run.data[label] = {"skipped": "time"}
                continue
            try:
                phase()
            except Exception as err:  # one broken phase must not lose the others' results
                run.data[label] = {"failed": f"{type(err).__name__}: {err}"}
            run.save()
    summary(run)
    run.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
