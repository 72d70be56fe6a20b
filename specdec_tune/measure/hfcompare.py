"""transformers' own assisted generation on our workload: the yardstick for `bench --compare-hf`.

An `HFConfig` (draft kind, gamma, threshold) becomes `generate()` arguments; each prompt is generated
on its own (HF's assisted decoding is batch size 1 only); both engines are timed in the same run.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..domain import DRAFT_KINDS, DraftSpec
from ..errors import SpecDecError
from ..limits import check_count, check_decoding, check_gamma, check_threshold
from ..runtime.caches.modes import ExecutionContext
from ..runtime.drafting.build import build_drafter
from ..runtime.drafting.drafters import Drafter
from ..runtime.workloads import Case
from .bench import run_pass
from .timing import interleaved, median, spread

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# transformers (5.x) reads these from the generation_config of the model that DRAFTS (the assistant, or
# the target itself for early exit); passed to generate() they are silently ignored.
DRAFTER_KEYS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")

# Our engine samples softmax(logits / T) as is; a checkpoint's generation_config may add top-k (HF's
# default is 50), top-p, a repetition penalty ... which would make HF decode a different distribution.
_PLAIN_ANY = {"repetition_penalty": 1.0, "no_repeat_ngram_size": 0}
_PLAIN_SAMPLING = {
    "top_k": 0,
    "top_p": 1.0,
    "min_p": None,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
}


@dataclass
class HFConfig:
    """One config in the terms both engines share; `draft_model` for kind "model", `ngram_max` for
    prompt lookup (HF always falls back down to 1-grams), `layers` for layer-skip."""

    kind: str
    gamma: int
    threshold: float = 0.0
    draft_model: PreTrainedModel | None = None
    ngram_max: int = 3
    layers: int | None = None

    def __post_init__(self) -> None:
        check_gamma(self.gamma)
        check_threshold(self.threshold)
        if self.kind not in DRAFT_KINDS:
            raise SpecDecError(f"unknown draft kind '{self.kind}': use one of {', '.join(DRAFT_KINDS)}")
        if self.kind == "model" and self.draft_model is None:
            raise SpecDecError("kind 'model' needs a draft model to compare with transformers; pass --draft")
        if self.kind == "prompt_lookup" and self.ngram_max < 1:
            raise SpecDecError(f"prompt lookup needs ngram_max >= 1, got {self.ngram_max}")
        if self.kind == "layer_skip" and (self.layers is None or self.layers < 1):
            raise SpecDecError(f"layer-skip needs the number of draft layers (>= 1), got {self.layers}")

    @property
    def plain(self) -> bool:
        return self.kind == "none" or self.gamma == 0

    def generate_kwargs(self) -> dict[str, Any]:
        """The `generate()` arguments; the DRAFTER_KEYS among them belong on the drafting model's
        generation_config (`run_hf_pass` puts them there). Plain decoding is {}."""
        if self.plain:
            return {}
        drafting = {
            "num_assistant_tokens": self.gamma,
            "num_assistant_tokens_schedule": "constant",
            # Explicit even when 0: left unset, transformers defaults it to 0.4.
            "assistant_confidence_threshold": float(self.threshold),
        }
        if self.kind == "model":
            return {"assistant_model": self.draft_model, **drafting}
        if self.kind == "prompt_lookup":
            return {"prompt_lookup_num_tokens": self.gamma, "max_matching_ngram_size": self.ngram_max}
        return {"assistant_early_exit": int(self.layers or 1), **drafting}

    def drafter(self, target: PreTrainedModel, ctx: ExecutionContext | None = None) -> Drafter | None:
        """Our drafter for the same config (None for plain decoding), its cache under `ctx`."""
        spec = DraftSpec("draft", self.kind, ngram_min=1, ngram_max=self.ngram_max, layers=self.layers)
        return build_drafter(spec, target, {"draft": self.draft_model}, ctx)


def check_hf_layer_skip(target: PreTrainedModel, layers: int) -> None:
    """HF's early exit lowers config.num_hidden_layers while drafting; only decoders that loop over
    `self.layers[: self.config.num_hidden_layers]` (Llama, Qwen2, Mistral ...) then really skip layers."""
    base = getattr(target, getattr(target, "base_model_prefix", ""), None)
    try:
        source = inspect.getsource(type(base).forward) if base is not None else ""
    except (OSError, TypeError):
        source = ""
    if "num_hidden_layers]" not in source:
        raise SpecDecError(
            f"transformers has no layer-skip (assistant_early_exit) for {type(target).__name__}: its decoder "
            "runs every layer whatever num_hidden_layers says; compare another draft kind with --compare-hf"
        )
    total = base.config.num_hidden_layers
    if not 1 <= layers < total:
        raise SpecDecError(
            f"layer-skip needs 1 <= layers < {total} (the target has {total} layers), got {layers}"
        )


@contextmanager
def _drafting_config(model: PreTrainedModel, settings: dict[str, Any]) -> Iterator[None]:
    """Put `settings` on `model.generation_config` for the duration, and pin HF's threshold.

    With scikit-learn installed, HF re-tunes assistant_confidence_threshold from an ROC curve after
    every step; a comparison at one threshold needs it fixed, so that hook is switched off meanwhile.
    """
    from transformers.generation import candidate_generator

    saved_config = model.generation_config if model is not None else None
    saved_sklearn = getattr(candidate_generator, "is_sklearn_available", None)
    try:
        if model is not None and settings:
            model.generation_config = copy.deepcopy(saved_config)
            for key, value in settings.items():
                setattr(model.generation_config, key, value)
        if saved_sklearn is not None:
            candidate_generator.is_sklearn_available = lambda: False
        yield
    finally:
        if model is not None:
            model.generation_config = saved_config
        if saved_sklearn is not None:
            candidate_generator.is_sklearn_available = saved_sklearn


def _until_eos(tokens: list[int], eos: set[int]) -> list[int]:
    """Tokens up to and including the first EOS: what our engine returns, and HF before its padding."""
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens


def run_hf_pass(target: PreTrainedModel, case: Case, cfg: HFConfig, seed: int = 0) -> list[list[int]]:
    """Generate every prompt of `case` with transformers' generate(); the new tokens per prompt.

    Sampling draws from torch's global generator (HF takes no generator), seeded with `seed` here.
    """
    kwargs = cfg.generate_kwargs()
    settings = {k: kwargs.pop(k) for k in DRAFTER_KEYS if k in kwargs}
    drafting_model = cfg.draft_model if cfg.kind == "model" else target
    if "assistant_early_exit" in kwargs:
        check_hf_layer_skip(target, kwargs["assistant_early_exit"])
    device = next(target.parameters()).device
    eos = list(case.eos)
    pad = target.generation_config.pad_token_id
    pad = pad if pad is not None else (eos[0] if eos else 0)
    if settings:
        # The drafter's own generate() fills an unset EOS from ITS checkpoint and would stop drafting
        # there even where the target ignores EOS; pin it to the workload's.
        settings["eos_token_id"] = eos or None
    mode: dict[str, Any] = dict(_PLAIN_ANY)
    if case.temperature > 0:
        mode |= {"do_sample": True, "temperature": case.temperature, **_PLAIN_SAMPLING}
        torch.manual_seed(seed)
    else:
        mode["do_sample"] = False
    outputs = []
    with _drafting_config(drafting_model, settings):
        for prompt, max_new in zip(case.prompts, case.max_new_tokens, strict=True):
            ids = torch.tensor([prompt], dtype=torch.long, device=device)
            out = target.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new,
                eos_token_id=eos or None,  # None, not the checkpoint's EOS: our engine then ignores EOS too
                pad_token_id=pad,
                **mode,
                **kwargs,
            )
            outputs.append(_until_eos(out[0, len(prompt) :].tolist(), set(eos)))
    return outputs


def measure_hf(
    target: PreTrainedModel,
    case: Case,
    cfg: HFConfig,
    repeats: int = 3,
    warmup: int = 1,
    seed: int = 0,
    ctx: ExecutionContext | None = None,
) -> dict[str, Any]:
    """Our speculative pass against HF's on `case`, interleaved after a warm-up.

    ratio = median over repeats of (our tokens/s) / (HF tokens/s); identical_tokens compares the
    outputs prompt by prompt (greedy only: sampled outputs differ by design, and it is None then).
    """
    check_count(repeats, "repeats")
    check_decoding(cfg.gamma, cfg.threshold, case.temperature, min(case.max_new_tokens))
    drafter = cfg.drafter(target, ctx)
    device = str(next(target.parameters()).device)
    runs = {
        "ours": lambda r, c=case: run_pass(target, drafter, cfg.gamma, cfg.threshold, c, seed + r, ctx)[0],
        "hf": lambda r, c=case: run_hf_pass(target, c, cfg, seed + r),
    }
    warm = case.head(1)
    for _ in range(warmup):
        runs["ours"](0, warm)
        runs["hf"](0, warm)
    timings = interleaved(runs, repeats, device)
    rates = {k: [sum(map(len, out)) / sec for sec, out in v] for k, v in timings.items()}
    ratios = [a / b for a, b in zip(rates["ours"], rates["hf"], strict=True)]
    outs = {k: v[-1][1] for k, v in timings.items()}
    return {
        "ours_tokens_per_s": median(rates["ours"]),
        "hf_tokens_per_s": median(rates["hf"]),
        "ratio": median(ratios),
        "ratio_spread": spread(ratios),
        "ratios": ratios,
        "identical_tokens": outs["ours"] == outs["hf"] if case.temperature == 0.0 else None,
        "repeats": repeats,
        "tokens_ours": sum(map(len, outs["ours"])),
        "tokens_hf": sum(map(len, outs["hf"])),
    }
