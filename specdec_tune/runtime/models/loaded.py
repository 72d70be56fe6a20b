"""What a loaded model is (`LoadedModel`) and how its dtype is chosen: the types that model loading
(`models`) and shape building (`shapes`) share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...errors import SpecDecError

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass
class LoadedModel:
    """A model ready for decoding, with where it came from."""

    name: str  # what the user passed, or the demo name
    path: str
    revision: str | None  # the HF snapshot commit when loaded from the cache
    model: PreTrainedModel  # transformers PreTrainedModel
    tokenizer: (
        PreTrainedTokenizerBase | None
    )  # transformers tokenizer; None for a shape (random weights, runtime.models.shapes)
    dtype: str
    device: str
    weights: str = "trained"  # "random": built from a shape's config, for timing only
    shape: str | None = None  # the shape's name when weights are random

    @property
    def num_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def choose_dtype(dtype: str, device: str) -> Any:
    """'auto' is float32 on CPU (fastest and exact there) and bfloat16 on CUDA when supported."""
    import torch

    if dtype not in DTYPES:
        raise SpecDecError(f"unknown dtype '{dtype}': use one of {', '.join(DTYPES)}")
    if dtype == "auto":
        if device.startswith("cuda"):
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    return getattr(torch, dtype)
