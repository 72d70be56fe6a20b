"""Shape-only models: the `config.json` of a well-known architecture (bundled in data/shapes, or any
transformers config file) built with random weights directly on the device, so `profile` can
measure T_target, C_ver(γ) and T_draft at real model sizes before any weights are on the machine.

A model reference `shape:NAME` names one (`shape:llama-3.1-8b`, or `shape:path/to/config.json`).
Such a model has no tokenizer (`LoadedModel.tokenizer` is None) and its outputs mean nothing:
timings are real, acceptance is not.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...domain import slugify
from ...errors import SpecDecError
from .loaded import LoadedModel, choose_dtype

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig, PreTrainedModel

SHAPES_DIR = Path(__file__).resolve().parents[2] / "data" / "shapes"
SHAPE_PREFIX = "shape:"
# The context length a shape is profiled at when `--context-len` is not given: there are no
# prompts to take a typical mid-generation length from.
SHAPE_CONTEXT_LEN = 512
INIT_SEED = 0


def bundled_shapes() -> list[str]:
    """Names of the configs shipped with the package, e.g. "llama-3.1-8b"."""
    return sorted(p.stem for p in SHAPES_DIR.glob("*.json"))


def is_shape_ref(text: object) -> bool:
    """Whether a model reference (`--target`, `--draft`, a stored path) names a shape."""
    return isinstance(text, str) and text.strip().startswith(SHAPE_PREFIX)


def _bare(ref: str) -> str:
    ref = ref.strip()
    return ref[len(SHAPE_PREFIX) :].strip() if ref.startswith(SHAPE_PREFIX) else ref


def shape_file(ref: str) -> Path:
    """The config file of `shape:NAME` (or bare NAME): a bundled name, a .json file, or a folder
    holding a config.json. An unknown name is a SpecDecError that lists the bundled ones."""
    name = _bare(ref)
    if name in bundled_shapes():
        return SHAPES_DIR / f"{name}.json"
    p = Path(name).expanduser()
    if p.is_dir() and (p / "config.json").is_file():
        return p / "config.json"
    if p.is_file() and p.suffix == ".json":
        return p
    raise SpecDecError(
        f"unknown shape '{name}': bundled shapes are {', '.join(bundled_shapes())}; "
        "or give the path of a transformers config.json"
    )


def shape_name(ref: str) -> str:
    """How tables and files name a shape: the bundled name, else the config file's (or its folder's) name."""
    path = shape_file(ref)
    if path.parent == SHAPES_DIR:
        return path.stem
    return slugify(path.parent.name if path.name == "config.json" else path.stem)


def shape_config(ref: str) -> Any:
    """The shape's transformers config (PretrainedConfig); a config that is not one is a SpecDecError."""
    path = shape_file(ref)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SpecDecError(f"cannot read shape config {path}: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict) or not isinstance(data.get("model_type"), str):
        raise SpecDecError(f"shape config {path} has no model_type: is it a transformers config.json?")
    from transformers import AutoConfig

    try:
        return AutoConfig.for_model(**data)
    except (ValueError, KeyError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecDecError(f"shape config {path} is not a config transformers knows: {first}") from None


def _build(config: PretrainedConfig, dtype: torch.dtype) -> PreTrainedModel:
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    try:
        return AutoModelForCausalLM.from_config(config, dtype=dtype)
    except ValueError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecDecError(
            f"shape '{config.model_type}' is not a causal LM transformers builds: {first}"
        ) from None


def shape_num_params(ref: str) -> int:
    """Parameters of the shape, counted on the meta device (nothing allocated; tied weights once)."""
    import torch

    with torch.device("meta"):
        model = _build(shape_config(ref), torch.bfloat16)
    return sum(p.numel() for p in model.parameters())


def load_shape(ref: str, device: str = "cpu", dtype: str = "auto") -> LoadedModel:
    """Build the shape with seeded random weights on `device` (already resolved) in `dtype`.

    Built under the device as default device and `dtype` as default dtype, so an 8B model in
    bfloat16 never exists in float32 or on the host first; transformers' own initialisation
    (normal, std = initializer_range; norms at 1) keeps every activation finite. The global
    random state is left as it was.
    """
    import torch

    config = shape_config(ref)
    torch_dtype = choose_dtype(dtype, device)
    cuda = [torch.device(device).index or 0] if device.startswith("cuda") else []
    with torch.random.fork_rng(devices=cuda), torch.device(device):
        torch.manual_seed(INIT_SEED)
        model = _build(config, torch_dtype)
    model.eval()
    name = shape_name(ref)
    return LoadedModel(
        name=SHAPE_PREFIX + name,
        path=str(shape_file(ref)),
        revision=None,
        model=model,
        tokenizer=None,
        dtype=str(torch_dtype).removeprefix("torch."),
        device=device,
        weights="random",
        shape=name,
    )
