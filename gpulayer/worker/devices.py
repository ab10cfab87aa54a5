"""The GPUs a job is shown: the environment that shows it exactly those it holds (NVIDIA's and AMD's
variables), and, read back from that environment, which devices those are."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from ..inventory import GPU


def visible_devices(offered: Sequence[GPU], held: Iterable[int]) -> dict[str, str]:
    """The environment that shows a job exactly the GPUs it ``held`` (indices) of those ``offered``.

    NVIDIA's: ``CUDA_VISIBLE_DEVICES`` in nvidia-smi's numbering; none held, none seen. AMD's: ROCm's
    ``ROCR_VISIBLE_DEVICES`` names them (by UUID where known) and renumbers them from 0, so HIP's
    ``HIP_VISIBLE_DEVICES``, read after it, counts 0 to n-1; ``-1`` in both hides every AMD GPU from a
    job that holds none. On a worker with AMD GPUs only, ``CUDA_VISIBLE_DEVICES`` says what HIP's
    does, since HIP and PyTorch's ROCm build read it too."""
    chosen = set(held)
    cuda = [str(gpu.index) for gpu in offered if gpu.kind == "cuda" and gpu.index in chosen]
    rocm = [gpu for gpu in offered if gpu.kind == "rocm" and gpu.index in chosen]
    rocr = [gpu.uuid if gpu.uuid.startswith("GPU-") and not gpu.simulated else str(gpu.index) for gpu in rocm]
    hip = ",".join(str(position) for position in range(len(rocm)))
    amd_only = not any(gpu.kind == "cuda" for gpu in offered) and any(gpu.kind == "rocm" for gpu in offered)
    return {
        "CUDA_VISIBLE_DEVICES": hip if amd_only else ",".join(cuda),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "ROCR_VISIBLE_DEVICES": ",".join(rocr) or "-1",
        "HIP_VISIBLE_DEVICES": hip or "-1",
    }


def devices_shown(env: Mapping[str, str]) -> list[str]:
    """The devices an environment :func:`visible_devices` made shows, each named once and apart from
    its numbering there: ``cuda:N`` (nvidia-smi's index), ``rocm:ID`` (a ROCm UUID or index). Where
    ``CUDA_VISIBLE_DEVICES`` only repeats HIP's renumbering (AMD GPUs only), it names nothing more."""
    rocm = [device for device in env.get("ROCR_VISIBLE_DEVICES", "").split(",") if device and device != "-1"]
    alias = bool(rocm) and env.get("CUDA_VISIBLE_DEVICES") == env.get("HIP_VISIBLE_DEVICES")
    cuda = [] if alias else [device for device in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if device]
    return [f"cuda:{device}" for device in cuda] + [f"rocm:{device}" for device in rocm]
