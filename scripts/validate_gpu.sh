#!/bin/sh
# Checks GPUlayer's GPU claims on this machine's NVIDIA GPU (benchmarks/validate_gpu.py; its options
# pass through). Makes .venv from this checkout first when it lacks torch or gpulayer, with the
# system's site packages, so that a machine's own CUDA build of torch is used, not downloaded again.
# Offline, point pip at a folder of wheels: PIP_NO_INDEX=1 PIP_FIND_LINKS=DIR scripts/validate_gpu.sh
set -eu
cd "$(dirname "$0")/.."
if ! .venv/bin/python -c 'import torch, gpulayer' 2>/dev/null; then
    python3 -m venv --system-site-packages .venv && .venv/bin/pip install -q -e '.[torch]'
fi
exec .venv/bin/python benchmarks/validate_gpu.py "$@"
