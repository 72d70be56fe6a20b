"""Hardware fingerprint, slugs, device parsing; CUDA paths are exercised with a faked torch.cuda."""

from types import SimpleNamespace

import pytest
import torch
import yaml

from specdec_tune.errors import SpecDecError
from specdec_tune.measure.hardware import hardware_info, hardware_slug, same_hardware
from specdec_tune.runtime.models.devices import resolve_device, synchronize
from specdec_tune.runtime.models.loading import slugify


@pytest.mark.parametrize(
    ("text", "slug"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b-instruct"),
        ("Qwen/Qwen2.5-0.5B-Instruct", "qwen2.5-0.5b-instruct"),
        ("/home/me/models/tiny_target/", "tiny-target"),
        ("NVIDIA H200", "nvidia-h200"),
        ("NVIDIA GeForce RTX 4090", "nvidia-geforce-rtx-4090"),
        ("NVIDIA A100-SXM4-80GB", "nvidia-a100-sxm4-80gb"),
        ("..", "unknown"),
        ("", "unknown"),
    ],
)
def test_slugify(text, slug):
    assert slugify(text) == slug


@pytest.mark.parametrize(
    ("cpu_model", "threads", "slug"),
    [
        ("Intel(R) Xeon(R) Processor", 2, "cpu-intel-xeon-2t"),
        ("AMD EPYC 7763 64-Core Processor", 2, "cpu-amd-epyc-7763-2t"),
        ("Intel(R) Core(TM) i7-9750H CPU @ 2.60GHz", 6, "cpu-intel-core-i7-9750h-6t"),
        ("Intel(R) Xeon(R) Platinum 8370C CPU @ 2.80GHz", 16, "cpu-intel-xeon-platinum-8370c-16t"),
        ("AMD Ryzen 7 7840U w/ Radeon 780M Graphics", 8, "cpu-amd-ryzen-7-7840u-w-radeon-780m-graphics-8t"),
        ("AMD Ryzen 5 5600G with Radeon Graphics", 12, "cpu-amd-ryzen-5-5600g-12t"),
        ("Apple M2 Pro", 8, "cpu-apple-m2-pro-8t"),
    ],
)
def test_cpu_slug(cpu_model, threads, slug):
    assert hardware_slug({"kind": "cpu", "cpu_model": cpu_model, "torch_threads": threads}) == slug


def test_gpu_slug():
    assert hardware_slug({"kind": "cuda", "gpu_name": "NVIDIA H200"}) == "nvidia-h200"
    assert hardware_slug({"kind": "cuda", "gpu_name": "NVIDIA GeForce RTX 4090"}) == "nvidia-geforce-rtx-4090"


def test_cpu_fingerprint_on_this_machine():
    info = hardware_info("cpu")
    for key in ("kind", "slug", "torch", "transformers", "python", "platform", "cpu_model"):
        assert isinstance(info[key], str) and info[key]
    for key in ("physical_cores", "logical_cores", "torch_threads"):
        assert isinstance(info[key], int) and info[key] >= 1
    assert info["kind"] == "cpu"
    assert info["torch_threads"] == torch.get_num_threads()
    assert info["ram_gb"] > 0
    assert info["physical_cores"] <= info["logical_cores"]
    assert info["slug"] == hardware_slug(info)
    assert info["slug"].startswith("cpu-") and info["slug"].endswith(f"-{info['torch_threads']}t")
    assert "gpu_name" not in info
    # Plain data: survives a YAML round trip unchanged.
    assert yaml.safe_load(yaml.safe_dump(info)) == info
    assert hardware_info("cpu") == info  # deterministic
    assert same_hardware(info, hardware_info("cpu"))


def test_same_hardware():
    cpu = {"kind": "cpu", "cpu_model": "Intel(R) Xeon(R) Processor", "torch_threads": 2}
    cpu["slug"] = hardware_slug(cpu)
    assert same_hardware(cpu, dict(cpu, ram_gb=64.0, torch="2.13.0"))  # versions/RAM don't matter
    assert not same_hardware(cpu, dict(cpu, torch_threads=4, slug="cpu-intel-xeon-4t"))
    other_model = dict(cpu, cpu_model="Intel(R) Xeon(R) CPU")  # same slug, different part
    assert not same_hardware(cpu, other_model)
    h200 = {"kind": "cuda", "gpu_name": "NVIDIA H200", "slug": "nvidia-h200", "cpu_model": "x"}
    assert same_hardware(h200, dict(h200, cpu_model="y", torch_threads=99))
    assert not same_hardware(h200, dict(h200, gpu_name="NVIDIA H100", slug="nvidia-h100"))
    assert not same_hardware(h200, cpu)
    # A fingerprint without a stored slug (hand-written YAML) is compared by its computed slug.
    assert same_hardware({k: v for k, v in cpu.items() if k != "slug"}, cpu)


def test_one_slug_with_another_vector_instruction_set_is_other_hardware():
    """Two VMs of cpu-amd-epyc-2t, both "AMD EPYC", came with AVX-512 and with AVX2 only: the
    fingerprint says which, and a profile whose CPU had the other is other hardware; a profile from
    before `cpu_isa` is compared without it."""
    from specdec_tune.measure.hardware import cpu_isa, hardware_difference

    assert cpu_isa("flags\t\t: fpu sse2 avx2 fma avx512f avx512bw avx512_bf16\n") == "avx512-bf16"
    assert cpu_isa("flags\t\t: fpu sse2 avx2 fma\n") == "avx2"
    assert cpu_isa("Features\t: fp asimd evtstrm sve\n") == "sve"
    assert cpu_isa("processor\t: 0\n") == ""
    genoa = {"kind": "cpu", "cpu_model": "AMD EPYC", "torch_threads": 2, "cpu_isa": "avx512-bf16"}
    milan = dict(genoa, cpu_isa="avx2")
    assert hardware_slug(genoa) == hardware_slug(milan) == "cpu-amd-epyc-2t"
    assert (
        hardware_difference(genoa, milan)
        == "measured on a cpu-amd-epyc-2t with avx512-bf16, this one has avx2"
    )
    assert not same_hardware(genoa, milan)
    older = {k: v for k, v in genoa.items() if k != "cpu_isa"}
    assert same_hardware(older, milan) and hardware_difference(genoa, dict(genoa)) is None


def test_resolve_device_cpu_and_auto_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("cpu") == "cpu"
    assert resolve_device(" CPU ") == "cpu"
    assert resolve_device("auto") == "cpu"


@pytest.mark.parametrize("spec", ["cuda", "cuda:0", "auto-ish", "gpu", "cuda:x", "mps", ""])
def test_resolve_device_errors_without_cuda(monkeypatch, spec):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SpecDecError) as err:
        resolve_device(spec)
    if spec.startswith("cuda") and spec != "cuda:x":
        assert "CUDA was requested but torch.cuda.is_available() is False" in str(err.value)
    else:
        assert f"unknown device {spec!r}: use auto, cpu, cuda or cuda:N" in str(err.value)


@pytest.fixture
def fake_cuda(monkeypatch):
    """Two fake H200s, so the CUDA branches run on a CPU-only machine."""
    props = SimpleNamespace(
        name="NVIDIA H200", major=9, minor=0, total_memory=150_000_000_000, multi_processor_count=132
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    return synced


def test_resolve_device_with_cuda(fake_cuda):
    assert resolve_device("auto") == "cuda"
    assert resolve_device("cuda") == "cuda"
    assert resolve_device("cuda:1") == "cuda:1"
    with pytest.raises(SpecDecError, match=r"2 CUDA device\(s\), use cuda:0..cuda:1"):
        resolve_device("cuda:2")


def test_cuda_fingerprint(fake_cuda):
    info = hardware_info("cuda:1")
    assert info["kind"] == "cuda"
    assert info["slug"] == "nvidia-h200"
    assert info["gpu_name"] == "NVIDIA H200"
    assert info["compute_capability"] == "9.0"
    assert info["gpu_memory_gb"] == pytest.approx(139.7, abs=0.1)
    assert info["sm_count"] == 132
    assert info["gpu_count"] == 2
    assert "cuda" in info and "cpu_model" in info


def test_synchronize(fake_cuda):
    synchronize("cpu")
    assert fake_cuda == []
    synchronize("cuda:0")
    assert fake_cuda == ["cuda:0"]
