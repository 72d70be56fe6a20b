"""transformers' own assisted generation on our workload: the yardstick for `bench --compare-hf`.

A config (draft kind, gamma, threshold) becomes `generate()` arguments; each prompt is generated on its
own (HF's assisted decoding is batch size 1 only); both engines are timed in the same run, ABBA.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from .drafters import Drafter, build_drafter
from .engine import validate_args
from .errors import SpecDecError
from .measure import Case, run_pass
from .profile import DraftSpec
from .timing import median, spread, timed

KINDS = ("none", "model", "prompt_lookup", "layer_skip")

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


def hf_generate_kwargs(
    kind: str,
    gamma: int,
    threshold: float,
    draft_model: Any = None,
    ngram_max: int = 3,
    layers: int | None = None,
) -> dict[str, Any]:
    """The `generate()` arguments for a config; the DRAFTER_KEYS among them belong on the drafting
    model's generation_config (`run_hf_pass` puts them there). gamma 0 is plain decoding: {}."""
    validate_args(gamma, threshold, 0.0, 1)
    if kind not in KINDS:
        raise SpecDecError(f"unknown draft kind '{kind}': use one of {', '.join(KINDS)}")
    if kind == "none" or gamma == 0:
        return {}
    drafting = {
        "num_assistant_tokens": gamma,
        "num_assistant_tokens_schedule": "constant",
        # Explicit even when 0: left unset, transformers defaults it to 0.4.
        "assistant_confidence_threshold": float(threshold),
    }
    if kind == "model":
        if draft_model is None:
            raise SpecDecError("kind 'model' needs a draft model to compare with transformers; pass --draft")
        return {"assistant_model": draft_model, **drafting}
    if kind == "prompt_lookup":
        if ngram_max < 1:
            raise SpecDecError(f"prompt lookup needs ngram_max >= 1, got {ngram_max}")
        # HF matches n-grams from max_matching_ngram_size down to 1, like ngram_min = 1 here.
        return {"prompt_lookup_num_tokens": gamma, "max_matching_ngram_size": ngram_max}
    if layers is None or layers < 1:
        raise SpecDecError(f"layer-skip needs the number of draft layers (>= 1), got {layers}")
    return {"assistant_early_exit": int(layers), **drafting}


def check_hf_layer_skip(target: Any, layers: int) -> None:
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
def _drafting_config(model: Any, settings: dict[str, Any]) -> Iterator[None]:
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


def run_hf_pass(
    target: Any,
    case: Case,
    kind: str,
    gamma: int,
    threshold: float,
    draft_model: Any = None,
    ngram_max: int = 3,
    layers: int | None = None,
    seed: int = 0,
) -> list[list[int]]:
    """Generate every prompt of `case` with transformers' generate(); the new tokens per prompt.

    Sampling draws from torch's global generator (HF takes no generator), seeded with `seed` here.
    """
    kwargs = hf_generate_kwargs(kind, gamma, threshold, draft_model, ngram_max, layers)
    settings = {k: kwargs.pop(k) for k in DRAFTER_KEYS if k in kwargs}
    drafting_model = draft_model if kind == "model" else target
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


def our_drafter(
    target: Any, kind: str, draft_model: Any = None, ngram_max: int = 3, layers: int | None = None
) -> Drafter | None:
    """Our drafter for the same config as `hf_generate_kwargs` describes (None for kind 'none')."""
    if kind not in KINDS:
        raise SpecDecError(f"unknown draft kind '{kind}': use one of {', '.join(KINDS)}")
    if kind == "model" and draft_model is None:
        raise SpecDecError("kind 'model' needs a draft model; pass --draft")
    spec = DraftSpec(name="draft", kind=kind, ngram_min=1, ngram_max=ngram_max, layers=layers or 1)
    return build_drafter(spec, target, {"draft": draft_model})


def measure_hf(
    target: Any,
    case: Case,
    kind: str,
    gamma: int,
    threshold: float,
    draft_model: Any = None,
    ngram_max: int = 3,
    layers: int | None = None,
    repeats: int = 3,
    warmup: int = 1,
    seed: int = 0,
) -> dict[str, Any]:
    """Our speculative pass against HF's on `case`, interleaved ABBA after a warm-up.

    ratio = median over repeats of (our tokens/s) / (HF tokens/s); identical_tokens compares the
    outputs prompt by prompt (greedy only: sampled outputs differ by design, and it is None then).
    """
    if repeats < 1:
        raise SpecDecError(f"repeats must be >= 1, got {repeats}")
    validate_args(gamma, threshold, case.temperature, min(case.max_new_tokens))
    hf_generate_kwargs(kind, gamma, threshold, draft_model, ngram_max, layers)  # bad input fails first
    drafter = our_drafter(target, kind, draft_model, ngram_max, layers)
    device = str(next(target.parameters()).device)

    def ours(c: Case, s: int) -> list[list[int]]:
        return run_pass(target, drafter, gamma, threshold, c, s)[0]

    def hf(c: Case, s: int) -> list[list[int]]:
        return run_hf_pass(target, c, kind, gamma, threshold, draft_model, ngram_max, layers, s)

    warm = Case(case.prompts[:1], case.max_new_tokens[:1], case.eos, case.temperature)
    for _ in range(warmup):
        ours(warm, seed)
        hf(warm, seed)

    rates: dict[str, list[float]] = {"ours": [], "hf": []}
    outs: dict[str, list[list[int]]] = {}
    ratios = []
    for r in range(repeats):
        # ABBA order: a slow drift of the machine favours neither side.
        for which in ("ours", "hf") if r % 2 == 0 else ("hf", "ours"):
            fn = ours if which == "ours" else hf
            sec, outs[which] = timed(lambda fn=fn, r=r: fn(case, seed + r), device)
            rates[which].append(sum(map(len, outs[which])) / sec)
        ratios.append(rates["ours"][-1] / rates["hf"][-1])
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
