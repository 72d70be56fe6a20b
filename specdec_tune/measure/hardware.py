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
    return hardware_difference(a, b) is None


def hardware_difference(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """What differs between fingerprint `a` (a profile's) and `b` (this machine's) as far as speed
    is concerned, in a few words; None where nothing does. A CPU's vector instruction set counts
    where both say it (`cpu_isa`; older profiles do not): VMs of one slug came with AVX-512 on one
    and AVX2 only on another, and there vLLM's CPU build decoded SmolLM2 at 24 tokens/s against 35
    and its tuned speedup read 1.14x against 3.27x, the native demo pair's 0.85x of stored."""
    slug_a, slug_b = a.get("slug") or hardware_slug(a), b.get("slug") or hardware_slug(b)
    if slug_a != slug_b or a.get("kind") != b.get("kind"):
        return f"measured on {slug_a}, this machine is {slug_b}"
    if a.get("kind") == "cuda":
        same = a.get("gpu_name") == b.get("gpu_name")
        return None if same else f"measured on {a.get('gpu_name')}, this is {b.get('gpu_name')}"
    if a.get("cpu_model") != b.get("cpu_model") or a.get("torch_threads") != b.get("torch_threads"):
        return (
            f"measured on {a.get('cpu_model')} with {a.get('torch_threads')} threads, "
            f"this is {b.get('cpu_model')} with {b.get('torch_threads')}"
        )
    isa_a, isa_b = a.get("cpu_isa"), b.get("cpu_isa")
    if isa_a and isa_b and isa_a != isa_b:
        return f"measured on a {slug_a} with {isa_a}, this one has {isa_b}"
    return None


def cpu_isa(cpuinfo: str) -> str:
    """The widest vector instruction set this CPU offers its kernels (/proc/cpuinfo's flags), from
    "amx" (Intel AMX tiles) through "avx512-bf16", "avx512", "avx2" (x86) to "sve" and "neon" (Arm);
    "" where the flags cannot be read."""
    match = re.search(r"^(?:flags|Features)\s*:\s*(.+)$", cpuinfo, flags=re.MULTILINE)
    flags = set(match.group(1).split()) if match else set()
    ladder = [
        ("amx_tile", "amx"), ("avx512_bf16", "avx512-bf16"), ("avx512f", "avx512"), ("avx2", "avx2"),
        ("sve", "sve"), ("asimd", "neon"),
    ]  # fmt: skip
    return next((name for flag, name in ladder if flag in flags), "")


def local_cpu_isa() -> str:
    """This machine's `cpu_isa`, from /proc/cpuinfo ("" where it cannot be read)."""
    return cpu_isa(_read("/proc/cpuinfo"))


def machine_id() -> str | None:
    """This machine itself, not its kind, in this boot: a short hash of the OS's machine id
    (/etc/machine-id), the host name and the boot id (/proc/sys/kernel/random/boot_id), or None
    where none can be read. Two VMs of one slug differ in their absolute rates (a quiet check on
    another VM of the same kind read plain decoding 0.76x the stored rate, and 1.98x at B = 16), so
    `check` judges absolute rates only where this matches the profile's (output.rates). The boot id
    is in it because VMs made from one image share the other two: two VMs of `cpu-amd-epyc-2t`,
    whose matmul anchors read 102.8 and 87.0 GFLOP/s, both had the machine id 3d1219c7... and the
    host name `vm`, so a check on the second took the first's rates and speedup for its own
    (2026-12-06). A machine that reboots counts as another one: conservative, its absolute rates
    are then reported, not judged, until a run or `specdec-tune reference` stores its id again."""
    import hashlib
    import socket

    parts = [_read(f).strip() for f in ("/etc/machine-id", "/proc/sys/kernel/random/boot_id")]
    if not any(parts):
        return None
    return hashlib.sha256("|".join([*parts, socket.gethostname()]).encode()).hexdigest()[:16]


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
        "cpu_isa": cpu_isa(cpuinfo),
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
