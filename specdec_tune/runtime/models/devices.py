"""Which device to run on (`resolve_device`), the one place the device is synchronised, and the
machine-local cache folder (`cache_dir`).

torch is imported inside functions so this module stays cheap to import.
"""

from __future__ import annotations

import re
from pathlib import Path

from ... import paths
from ...errors import SpecDecError

_DEVICE_RE = re.compile(r"^cuda(?::(\d+))?$")


def resolve_device(spec: str) -> str:
    """Turn "auto" / "cpu" / "cuda" / "cuda:N" into a usable device string, or say what is wrong."""
    text = str(spec).strip().lower()
    if text == "cpu":
        return "cpu"
    import torch

    if text == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    match = _DEVICE_RE.match(text)
    if not match:
        raise SpecDecError(f"unknown device {spec!r}: use auto, cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise SpecDecError(
            "CUDA was requested but torch.cuda.is_available() is False: "
            "use --device cpu, or install a CUDA build of torch"
        )
    if match.group(1) is not None:
        index, count = int(match.group(1)), torch.cuda.device_count()
        if index >= count:
            raise SpecDecError(
                f"device {spec!r} does not exist: this machine has {count} CUDA device(s), "
                f"use cuda:0..cuda:{count - 1}"
            )
        return f"cuda:{index}"
    return "cuda"


def synchronize(device: str) -> None:
    """Wait for queued work on `device` to finish, so a timer reads real compute time."""
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


def cache_dir() -> Path:
    """specdec-tune's cache folder (`paths.cache_dir`)."""
    return paths.cache_dir()
