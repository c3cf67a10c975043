#!/usr/bin/env bash
# One short GPU lease (issue 28): tune and time the plugin kernels, then the GPU/C++ kernel tests.
# Usage: bench/gpu_lease.sh OUT [WORKERS]   (from any folder; CUDA GPU, torch, Triton, torchvision, CuPy, nvcc)
# Writes OUT/tune.json, OUT/tune.log, OUT/pytest.log, OUT/nvidia-smi.txt. Wheels in ./.whl (gskit's own
# dependencies the machine lacks) are installed into /tmp/site first.
set -u
out="${1:?usage: bench/gpu_lease.sh OUT [WORKERS]}"
workers="${2:-16}"
cd "$(dirname "$0")/.."
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:${PYTHONPATH:-}"
# Read-only queries: the card's state as found (clocks are never changed).
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu \
  --format=csv >"$out/nvidia-smi.txt" 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >>"$out/nvidia-smi.txt" 2>&1
# TUNE_ARGS: more arguments, e.g. "--only dcn" for a short run of one phase.
timeout "${TUNE_TIMEOUT:-300}" python3 bench/tune_kernels.py --out "$out" --workers "$workers" \
  --budget "${TUNE_BUDGET:-270}" ${TUNE_ARGS:-} >"$out/tune.log" 2>&1
echo "tune_kernels exit $?" >>"$out/tune.log"
parallel=()
python3 -c "import xdist" 2>/dev/null && parallel=(-n "$workers")
timeout "${TEST_TIMEOUT:-100}" python3 -m pytest -q "${parallel[@]}" -m "gpu or cpp" -p no:cacheprovider plugins \
  >"$out/pytest.log" 2>&1
echo "pytest exit $?" >>"$out/pytest.log"
tail -n 60 "$out/tune.log"
tail -n 25 "$out/pytest.log"
