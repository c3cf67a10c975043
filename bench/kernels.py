"""GPU kernels of the plugins against PyTorch eager and against the memory-bandwidth floor.

For each kernel and dtype: median time of the gskit kernel, of the PyTorch eager equivalent (``F.silu``,
``F.rms_norm``, ``F.layer_norm``; for DeformConv2d the plain-tensor-op version in ``bench/eager.py``, and
torchvision's ``deform_conv2d`` when importable), and the floor ``(bytes read + bytes written) / peak``,
where the peak bandwidth comes from a device-to-device copy benchmark on the same GPU. Ratios > 1 mean
slower than the other column. ``max_abs_diff_<eager>`` is the largest difference between the kernel's
output (NaN-filled before the run) and that eager output: a sanity check, not the kernels' accuracy tests.

Goals (issue 8): a memory-bound kernel (ClampSwish, RMSNorm, LayerNorm) within ``FLOOR_GOAL`` of the floor,
and every kernel no slower than PyTorch eager. DeformConv2d does ``C_in * kH * kW`` multiply-adds per
output, so its floor ratio is reported but not judged. The ``goal`` column says which goal a row misses.
Run: ``python bench/kernels.py [--reps 50] [--json]`` (needs a CUDA GPU, torch and Triton); exit 1 when a
goal is missed. ``--smoke`` runs the same code on a CPU with Triton's interpreter and tiny shapes: a check
of the benchmark itself (tests/test_bench_eager.py runs it), whose times mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: Bytes copied by the bandwidth benchmark.
COPY_BYTES = 1 << 30
#: A memory-bound kernel may take at most this many times its bandwidth floor.
FLOOR_GOAL = 1.5
#: And at most this many times PyTorch eager.
EAGER_GOAL = 1.0


def time_ms(fn: Callable[[], Any], reps: int, warmup: int = 5) -> float:
    """Median milliseconds of ``fn`` on the current CUDA stream (CUDA events around each call).

    Without CUDA (``--smoke``): wall-clock milliseconds of each call.
    """
    import torch

    for _ in range(warmup):
        fn()
    times = []
    if not torch.cuda.is_available():
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)
    torch.cuda.synchronize()
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def peak_bandwidth(reps: int, device: str = "cuda", nbytes: int = COPY_BYTES) -> float:
    """Bytes per millisecond of a large device-to-device copy (read + write counted)."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * nbytes / time_ms(lambda: dst.copy_(src), reps)


def cases(dtype: Any, device: str = "cuda", small: bool = False) -> list[dict[str, Any]]:
    """Each case: name, shape label, gskit callable, eager callables by label, tensors touched (output last).

    ``small``: tiny shapes with odd sizes, for ``--smoke``.
    """
    import torch
    import torch.nn.functional as F

    from bench.eager import deform_conv2d as eager_deform_conv2d
    from plugins.clamp_swish.kernel import clamp_swish
    from plugins.deform_conv2d.kernel import deform_conv2d
    from plugins.layer_norm.kernel import layer_norm
    from plugins.rms_norm.kernel import rms_norm

    def rand(*shape: int) -> Any:
        return torch.randn(shape, dtype=dtype, device=device)

    found = []
    x = rand(3, 17, 33) if small else rand(64, 1024, 1024)
    y = torch.empty_like(x)
    found.append(dict(
        name="ClampSwish", shape=tuple(x.shape), gskit=lambda: clamp_swish(x, y),
        eager={"torch": lambda: F.silu(x.clamp(min=0))}, tensors=[x, y], memory_bound=True,
    ))  # fmt: skip
    for cols in (77, 1030) if small else (768, 4096):
        xn, w, b = rand(5 if small else 16384, cols), rand(cols), rand(cols)
        yn = torch.empty_like(xn)
        found.append(dict(
            name="RMSNorm", shape=tuple(xn.shape),
            gskit=lambda xn=xn, w=w, yn=yn: rms_norm(xn, w, yn, epsilon=1e-5),
            eager={"torch": lambda xn=xn, w=w: F.rms_norm(xn, (xn.shape[-1],), w, eps=1e-5)},
            tensors=[xn, w, yn], memory_bound=True,
        ))  # fmt: skip
        found.append(dict(
            name="LayerNorm", shape=tuple(xn.shape),
            gskit=lambda xn=xn, w=w, b=b, yn=yn: layer_norm(xn, w, b, yn, epsilon=1e-5),
            eager={"torch": lambda xn=xn, w=w, b=b: F.layer_norm(xn, (xn.shape[-1],), w, b, eps=1e-5)},
            tensors=[xn, w, b, yn], memory_bound=True,
        ))  # fmt: skip
    n, c, hw = (1, 6, 9) if small else (8, 64, 64)
    xd, wd, bd = rand(n, c, hw, hw), rand(c, c, 3, 3), rand(c)
    off, mask = rand(n, 18, hw, hw), torch.rand(n, 9, hw, hw, dtype=dtype, device=device)
    yd = torch.empty(n, c, hw, hw, dtype=dtype, device=device)
    attrs = dict(strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1], group=1, offset_group=1)
    eager: dict[str, Callable[[], Any]] = {
        "torch": lambda: eager_deform_conv2d(xd, wd, off, bd, mask, **attrs),
    }
    try:
        from torchvision.ops import deform_conv2d as tv_deform_conv2d

        eager["torchvision"] = lambda: tv_deform_conv2d(xd, off, wd, bd, padding=(1, 1), mask=mask)
    except ImportError:
        pass
    found.append(dict(
        name="DeformConv2d", shape=tuple(xd.shape),
        gskit=lambda: deform_conv2d(xd, wd, off, bd, mask, yd, **attrs),
        eager=eager, tensors=[xd, wd, off, bd, mask, yd], memory_bound=False,
    ))  # fmt: skip
    return found


def poison(out: Any) -> None:
    """NaN-fill an output before the compared run, so an element the kernel skips shows in the diff."""
    out.fill_(float("nan"))


def goal_verdict(row: dict[str, Any]) -> str:
    """``ok``, or the goals a result row misses (``> 1.5x floor``, ``slower than torch``)."""
    missed = []
    if row["memory_bound"] and row["gskit_over_floor"] > FLOOR_GOAL:
        missed.append(f"> {FLOOR_GOAL}x floor")
    if row.get("gskit_over_torch", 0.0) > EAGER_GOAL:
        missed.append("slower than torch")
    return "; ".join(missed) or "ok"


def run(reps: int, smoke: bool = False) -> dict[str, Any]:
    """Time every case in float32 and float16 (``smoke``: on the CPU, tiny shapes)."""
    import torch

    device = "cpu" if smoke else "cuda"
    peak = peak_bandwidth(reps, device, 1 << 20 if smoke else COPY_BYTES)
    rows = []
    for dtype in (torch.float32, torch.float16):
        for case in cases(dtype, device, small=smoke):
            nbytes = sum(t.numel() * t.element_size() for t in case["tensors"])
            floor = nbytes / peak
            gskit_ms = time_ms(case["gskit"], reps)
            row = {
                "kernel": case["name"], "dtype": str(dtype).removeprefix("torch."), "shape": case["shape"],
                "gskit_ms": gskit_ms, "floor_ms": floor, "gskit_over_floor": gskit_ms / floor,
            }  # fmt: skip
            poison(case["tensors"][-1])
            out = case["gskit"]()
            for label, fn in case["eager"].items():
                row[f"{label}_ms"] = time_ms(fn, reps)
                row[f"gskit_over_{label}"] = gskit_ms / row[f"{label}_ms"]
                # Not a tolerance test (plugins/*/test_kernel.py are): a sign that both compute the same.
                row[f"max_abs_diff_{label}"] = (out.float() - fn().float()).abs().max().item()
            row["memory_bound"] = case["memory_bound"]
            row["goal"] = goal_verdict(row)
            rows.append(row)
            del case
        if not smoke:
            torch.cuda.empty_cache()
    name = "cpu (smoke run: times mean nothing)" if smoke else torch.cuda.get_device_name()
    return {"device": name, "peak_GBps": peak / 1e6, "results": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=50, help="timed repetitions per measurement")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument(
        "--smoke", action="store_true", help="check the benchmark on a CPU (Triton interpreter, tiny shapes)"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported
    try:
        import torch
    except ImportError:
        print(
            "bench/kernels.py needs torch and a CUDA GPU: pip install -e '.[torch]' and triton",
            file=sys.stderr,
        )
        return 2
    if not args.smoke and not torch.cuda.is_available():
        print("bench/kernels.py needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    try:
        import triton  # noqa: F401
    except ImportError:
        print("bench/kernels.py needs Triton: pip install triton", file=sys.stderr)
        return 2
    results = run(args.reps, smoke=args.smoke)
    met = all(r["goal"] == "ok" for r in results["results"])
    if args.json:
        print(json.dumps(results, indent=2))
        return 0 if met else 1
    print(f"{results['device']}: copy bandwidth {results['peak_GBps']:.0f} GB/s")
    print(
        f"{'kernel':<13} {'dtype':<8} {'shape':<20} {'gskit ms':>9} {'floor ms':>9} {'/floor':>7}  "
        f"{'goal':<32} eager"
    )
    for r in results["results"]:
        eager = "  ".join(
            f"{k[:-3]} {r[k]:.3f} ms (x{r['gskit_over_' + k[:-3]]:.2f}, max diff "
            f"{r['max_abs_diff_' + k[:-3]]:.1e})"
            for k in r
            if k.endswith("_ms") and k not in ("gskit_ms", "floor_ms")
        )
        print(
            f"{r['kernel']:<13} {r['dtype']:<8} {str(r['shape']):<20} {r['gskit_ms']:>9.3f} "
            f"{r['floor_ms']:>9.3f} {r['gskit_over_floor']:>7.2f}  {r['goal']:<32} {eager or '-'}"
        )
    print("all goals met" if met else "goals missed: see the goal column")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
