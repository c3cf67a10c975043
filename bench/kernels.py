"""GPU kernels of the plugins against PyTorch eager and against the memory-bandwidth floor.

For each kernel and dtype: median time of the gskit kernel, of the PyTorch eager equivalent (and of
torchvision's ``deform_conv2d`` when importable), and the floor ``(bytes read + bytes written) / peak``,
where the peak bandwidth comes from a device-to-device copy benchmark on the same GPU. Ratios > 1 mean
slower than the other column. Run: ``python bench/kernels.py [--reps 50] [--json]`` (needs a CUDA GPU,
torch and Triton).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: Bytes copied by the bandwidth benchmark.
COPY_BYTES = 1 << 30


def time_ms(fn: Callable[[], Any], reps: int, warmup: int = 5) -> float:
    """Median milliseconds of ``fn`` on the current CUDA stream (CUDA events around each call)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def peak_bandwidth(reps: int) -> float:
    """Bytes per millisecond of a large device-to-device copy (read + write counted)."""
    import torch

    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * COPY_BYTES / time_ms(lambda: dst.copy_(src), reps)


def cases(dtype: Any) -> list[dict[str, Any]]:
    """Each case: name, shape label, gskit callable, eager callables by label, tensors touched."""
    import torch
    import torch.nn.functional as F

    from plugins.clamp_swish.kernel import clamp_swish
    from plugins.deform_conv2d.kernel import deform_conv2d
    from plugins.layer_norm.kernel import layer_norm
    from plugins.rms_norm.kernel import rms_norm

    def rand(*shape: int) -> Any:
        return torch.randn(shape, dtype=dtype, device="cuda")

    found = []
    x = rand(64, 1024, 1024)
    y = torch.empty_like(x)
    found.append(dict(
        name="ClampSwish", shape=tuple(x.shape), gskit=lambda: clamp_swish(x, y),
        eager={"torch": lambda: F.silu(x.clamp(min=0))}, tensors=[x, y],
    ))  # fmt: skip
    for cols in (768, 4096):
        xn, w, b = rand(16384, cols), rand(cols), rand(cols)
        yn = torch.empty_like(xn)
        found.append(dict(
            name="RMSNorm", shape=tuple(xn.shape),
            gskit=lambda xn=xn, w=w, yn=yn: rms_norm(xn, w, yn, epsilon=1e-5),
            eager={"torch": lambda xn=xn, w=w: F.rms_norm(xn, (xn.shape[-1],), w, eps=1e-5)},
            tensors=[xn, w, yn],
        ))  # fmt: skip
        found.append(dict(
            name="LayerNorm", shape=tuple(xn.shape),
            gskit=lambda xn=xn, w=w, b=b, yn=yn: layer_norm(xn, w, b, yn, epsilon=1e-5),
            eager={"torch": lambda xn=xn, w=w, b=b: F.layer_norm(xn, (xn.shape[-1],), w, b, eps=1e-5)},
            tensors=[xn, w, b, yn],
        ))  # fmt: skip
    xd, wd, bd = rand(8, 64, 64, 64), rand(64, 64, 3, 3), rand(64)
    off, mask = rand(8, 18, 64, 64), torch.rand(8, 9, 64, 64, dtype=dtype, device="cuda")
    yd = torch.empty(8, 64, 64, 64, dtype=dtype, device="cuda")
    attrs = dict(strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1], group=1, offset_group=1)
    eager: dict[str, Callable[[], Any]] = {}
    try:
        from torchvision.ops import deform_conv2d as tv_deform_conv2d

        eager["torchvision"] = lambda: tv_deform_conv2d(xd, off, wd, bd, padding=(1, 1), mask=mask)
    except ImportError:
        pass
    found.append(dict(
        name="DeformConv2d", shape=tuple(xd.shape),
        gskit=lambda: deform_conv2d(xd, wd, off, bd, mask, yd, **attrs),
        eager=eager, tensors=[xd, wd, off, bd, mask, yd],
    ))  # fmt: skip
    return found


def run(reps: int) -> dict[str, Any]:
    """Time every case in float32 and float16."""
    import torch

    peak = peak_bandwidth(reps)
    rows = []
    for dtype in (torch.float32, torch.float16):
        for case in cases(dtype):
            nbytes = sum(t.numel() * t.element_size() for t in case["tensors"])
            floor = nbytes / peak
            gskit_ms = time_ms(case["gskit"], reps)
            row = {
                "kernel": case["name"], "dtype": str(dtype).removeprefix("torch."), "shape": case["shape"],
                "gskit_ms": gskit_ms, "floor_ms": floor, "gskit_over_floor": gskit_ms / floor,
            }  # fmt: skip
            for label, fn in case["eager"].items():
                row[f"{label}_ms"] = time_ms(fn, reps)
                row[f"gskit_over_{label}"] = gskit_ms / row[f"{label}_ms"]
            rows.append(row)
            del case
        torch.cuda.empty_cache()
    return {"device": torch.cuda.get_device_name(), "peak_GBps": peak / 1e6, "results": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=50, help="timed repetitions per measurement")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print(
            "bench/kernels.py needs torch and a CUDA GPU: pip install -e '.[torch]' and triton",
            file=sys.stderr,
        )
        return 2
    if not torch.cuda.is_available():
        print("bench/kernels.py needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    try:
        import triton  # noqa: F401
    except ImportError:
        print("bench/kernels.py needs Triton: pip install triton", file=sys.stderr)
        return 2
    results = run(args.reps)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"{results['device']}: copy bandwidth {results['peak_GBps']:.0f} GB/s")
    print(f"{'kernel':<13} {'dtype':<8} {'shape':<20} {'gskit ms':>9} {'floor ms':>9} {'/floor':>7}  eager")
    for r in results["results"]:
        eager = "  ".join(
            f"{k[:-3]} {r[k]:.3f} ms (x{r['gskit_over_' + k[:-3]]:.2f})"
            for k in r
            if k.endswith("_ms") and k not in ("gskit_ms", "floor_ms")
        )
        print(
            f"{r['kernel']:<13} {r['dtype']:<8} {str(r['shape']):<20} {r['gskit_ms']:>9.3f} "
            f"{r['floor_ms']:>9.3f} {r['gskit_over_floor']:>7.2f}  {eager or '-'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
