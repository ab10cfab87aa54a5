#!/bin/sh
# Checks GPUlayer's GPU claims on this machine's NVIDIA GPU (benchmarks/validate_gpu.py; its options
# pass through). Makes .venv from this checkout first when it lacks torch or gpulayer, seeing python3's
# own packages, so that a machine's CUDA build of torch is used, not downloaded again. Offline, point
# pip at a folder of wheels: PIP_NO_INDEX=1 PIP_FIND_LINKS=DIR scripts/validate_gpu.sh
set -eu
cd "$(dirname "$0")/.."
if ! .venv/bin/python -c 'import torch, gpulayer' 2>/dev/null; then
    python3 -m venv --system-site-packages .venv
    # --system-site-packages sees the base interpreter's packages only; where python3 is itself a
    # virtual environment's (as torch often is), a .pth file keeps its packages, behind .venv's own.
    site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    python3 -c 'import site; print("\n".join(site.getsitepackages()))' >"$site/_python3_packages.pth"
    .venv/bin/pip install -q -e '.[torch]'
fi
exec .venv/bin/python benchmarks/validate_gpu.py "$@"
