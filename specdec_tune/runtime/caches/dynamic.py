"""The target's and HF drafts' KV cache: which keyword a model's forward takes it by, and a new one.

transformers >= 5.x (recent) calls the argument `cache`, earlier 5.x `past_key_values`;
`DynamicCache.crop(-n)` drops the last n tokens (rollback after a rejected draft).
"""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def cache_kwarg(model: PreTrainedModel) -> str:
    """transformers >= 5.x (recent) calls the KV cache argument `cache`, earlier `past_key_values`."""
    return _cache_kwarg_of(type(model))


@functools.cache
def _cache_kwarg_of(cls: type) -> str:
    params = inspect.signature(cls.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def new_cache(model: PreTrainedModel) -> Any:
    from transformers import DynamicCache

    return DynamicCache(config=model.config)
