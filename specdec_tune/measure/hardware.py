"""The hardware fingerprint: what machine a measurement was taken on, as a plain YAML-able dict,
and its slug (the profile folder name). torch is imported inside functions so this module stays
cheap to import (`--help` must be instant).
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
from importlib import metadata
from typing import Any

from ..runtime.models.devices import resolve_device
from ..runtime.models.loading import slugify

# Marketing noise in CPU model strings that does not identify the part.
_CPU_NOISE = [
    r"\((?:R|TM|C)\)",
    r"@\s*[\d.]+\s*[GM]Hz",
    r"\b\d+-Core\b",
    r"\bCPU\b",
    r"\bProcessor\b",
    r"\bwith Radeon.*$",  # AMD APUs: "... with Radeon Graphics"
]


def _cpu_model_short(cpu_model: str) -> str:
    short = cpu_model
    for pattern in _CPU_NOISE:
        short = re.sub(pattern, " ", short, flags=re.IGNORECASE)
    return slugify(short.replace("/", " "))


def hardware_slug(info: dict[str, Any]) -> str:
    """Stable directory name for profiles: "nvidia-h200", "cpu-intel-xeon-2t", "cpu-amd-epyc-7763-2t".

    The CPU slug carries the torch thread count because it changes the costs as much as the chip.
    """
    if info.get("kind") == "cuda":
        return slugify(str(info.get("gpu_name") or "cuda"))
    threads = info.get("torch_threads") or info.get("logical_cores") or 1
    return f"cpu-{_cpu_model_short(str(info.get('cpu_model') or 'unknown'))}-{threads}t"


def same_hardware(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two fingerprints describe the same machine, as far as speed is concerned."""
    if a.get("kind") != b.get("kind"):
        return False
    if (a.get("slug") or hardware_slug(a)) != (b.get("slug") or hardware_slug(b)):
        return False
    if a.get("kind") == "cuda":
        return a.get("gpu_name") == b.get("gpu_name")
    return a.get("cpu_model") == b.get("cpu_model") and a.get("torch_threads") == b.get("torch_threads")


def machine_id() -> str | None:
    """This machine itself, not its kind: a short hash of the OS's machine id (/etc/machine-id, made
    at a VM's first boot; the boot id where there is none) and the host name, or None where neither
    can be read. Two VMs of one slug differ in it, and their absolute rates differ too (a quiet
    check on another VM of the same kind read plain decoding 0.76x the stored rate, and 1.98x at
    B = 16), so `check` judges absolute rates only where it matches the profile's (output.rates)."""
    import hashlib
    import socket

    ident = _read("/etc/machine-id").strip() or _read("/proc/sys/kernel/random/boot_id").strip()
    if not ident:
        return None
    return hashlib.sha256(f"{ident}|{socket.gethostname()}".encode()).hexdigest()[:16]


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _cpu_model(cpuinfo: str) -> str:
    match = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, flags=re.MULTILINE)
    if match:
        return match.group(1).strip()
    if platform.system() == "Darwin":
        try:
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=5
            )
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine() or "unknown"


def _physical_cores(cpuinfo: str) -> int:
    # Each (physical id, core id) pair is one core; hyperthreads repeat the pair.
    cores = set()
    physical = "0"
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "physical id":
            physical = value.strip()
        elif key == "core id":
            cores.add((physical, value.strip()))
    return len(cores) or os.cpu_count() or 1


def _ram_gb() -> float:
    match = re.search(r"^MemTotal:\s*(\d+)\s*kB", _read("/proc/meminfo"), flags=re.MULTILINE)
    if match:
        return round(int(match.group(1)) / 2**20, 1)
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return 0.0


def _version(package: str) -> str:
    # Package metadata, not an import: importing transformers just for its version costs seconds.
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _cuda_index(device: str) -> int:
    import torch

    _, _, index = device.partition(":")
    return int(index) if index else torch.cuda.current_device()


def _cuda_driver() -> str | None:
    # torch does not expose the driver version; NVML does when nvidia-ml-py is installed.
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:
        return None


def hardware_info(device: str = "cpu") -> dict[str, Any]:
    """Fingerprint of this machine for `device` ("cpu", "cuda" or "cuda:N"), as a plain dict.

    The host CPU fields are always present (the draft loop runs on the host too); the GPU fields
    only for a CUDA device.
    """
    import torch

    device = resolve_device(device)
    cpuinfo = _read("/proc/cpuinfo")
    info: dict[str, Any] = {
        "kind": "cuda" if device.startswith("cuda") else "cpu",
        "slug": "",
        # str(): torch.__version__ is a str subclass that yaml.safe_dump refuses.
        "torch": str(torch.__version__),
        "transformers": _version("transformers"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_model": _cpu_model(cpuinfo),
        "physical_cores": _physical_cores(cpuinfo),
        "logical_cores": os.cpu_count() or 1,
        "torch_threads": torch.get_num_threads(),
        "ram_gb": _ram_gb(),
    }
    if info["kind"] == "cuda":
        index = _cuda_index(device)
        props = torch.cuda.get_device_properties(index)
        info.update(
            {
                "gpu_name": str(props.name),
                "compute_capability": f"{props.major}.{props.minor}",
                "gpu_memory_gb": round(props.total_memory / 2**30, 1),
                "sm_count": int(props.multi_processor_count),
                "gpu_count": torch.cuda.device_count(),
                "cuda": str(torch.version.cuda) if torch.version.cuda else None,
            }
        )
        driver = _cuda_driver()
        if driver:
            info["driver"] = driver
    info["slug"] = hardware_slug(info)
    return info
