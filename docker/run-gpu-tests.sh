#!/usr/bin/env bash
# Build the GPU CI image and run gskit's TensorRT/GPU tests on this host's GPUs.
# Usage: docker/run-gpu-tests.sh [extra pytest args]   (needs Docker and the NVIDIA Container Toolkit)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
image="${GSKIT_GPU_IMAGE:-gskit-gpu-ci:latest}"
docker build -f "$repo/docker/Dockerfile" -t "$image" "$repo"
exec docker run --rm --gpus all "$image" python3 -m pytest -m "trt or gpu or cpp" "$@"
