"""Which configs each serving engine runs the way they were measured here: its drafters, its n-gram
lookup policy, what its confidence threshold compares. One place for these facts: `run --for`
restricts the search with them and `export` decides with them what it can hand over. Pure Python.

Read from the engines' own sources (commits in serving/flagsets.py, details in docs/export.md).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..domain import ENGINE_ONLY_KINDS, Config, DraftSpec
from ..errors import SpecDecError

ENGINES = ("hf", "vllm", "llamacpp", "sglang", "trtllm")


@dataclass(frozen=True)
class Engine:
    key: str
    display: str
    kinds: tuple[str, ...]  # draft kinds it runs like ours
    threshold_mode: str | None  # what its confidence stop compares (domain.THRESHOLD_MODES); None: none
    lookup_match: str | None  # which earlier n-gram occurrence its prompt lookup continues
    lookup_ngrams: str | None  # "down_to_1" (n = max..1), "range" (min..max), "single" (one n)
    # per draft kind, the per-step gamma policies besides "fixed" it runs (domain.GAMMA_POLICIES)
    gamma_policies: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)


ENGINE_INFO = {
    # transformers: assistant_confidence_threshold on the full softmax, the unsure token proposed;
    # PromptLookupCandidateGenerator tries n = max..1 and takes the first match left to right.
    # Its num_assistant_tokens_schedule="heuristic" (+2 / -1) adapts the assistant's and the
    # early-exit draft's length, not prompt lookup's.
    "hf": Engine(
        "hf",
        "HF transformers",
        ("model", "prompt_lookup", "layer_skip"),
        "hf",
        "earliest",
        "down_to_1",
        {"model": ("heuristic",), "layer_skip": ("heuristic",)},
    ),
    # vLLM: no threshold; the ngram proposer keeps the longest match in [min, max], earliest position.
    "vllm": Engine("vllm", "vLLM", ("model", "prompt_lookup"), None, "earliest", "range"),
    # llama.cpp: p-min on the top-1 after top-k 10 renormalisation; ngram-simple matches one n and
    # continues the last match in the history (llama.cpp/docs/speculative.md).
    "llamacpp": Engine("llamacpp", "llama.cpp", ("model", "prompt_lookup"), "topk10", "latest", "single"),
    # SGLang: no threshold; NGRAM drafts from a trie over all suffixes shared across requests, which
    # has no n-gram sizes, so our prompt lookup has no counterpart there.
    "sglang": Engine("sglang", "SGLang", ("model",), None, None, None),
    # TensorRT-LLM: DraftTargetDecodingConfig has no confidence threshold (acceptance_rate_threshold
    # switches speculation off for good when the rolling acceptance drops, another thing); its NGram
    # drafter tries n = max..1 and continues the oldest match, or the newest with is_use_oldest=False,
    # so either of our policies runs there (lookup_match None: set per config).
    "trtllm": Engine("trtllm", "TensorRT-LLM", ("model", "prompt_lookup"), None, None, "down_to_1"),
}

_MODE_TEXT = {
    "hf": "the draft's probability of its token (full softmax, HF's assistant_confidence_threshold)",
    "topk10": "the draft's top-1 probability after top-k 10 renormalisation (llama.cpp's p-min)",
}


def engine_info(name: str) -> Engine:
    key = name.strip().lower()
    if key not in ENGINE_INFO:
        raise SpecDecError(f"unknown engine {name!r}: choose one of {', '.join(ENGINES)}")
    return ENGINE_INFO[key]


def tunes_threshold(spec: DraftSpec, engine: str | None) -> bool:
    """Whether a search restricted to `engine` (None: no restriction) tunes a threshold for `spec`."""
    return spec.has_threshold and (engine is None or engine_info(engine).threshold_mode is not None)


def blockers(config: Config, engine: str, measured_in: str | None = None) -> list[str]:
    """Why `engine` cannot run `config` as it was measured; empty when it can. `measured_in`: the
    engine the profile was measured inside (its measuring backend), whose stored flags ran every
    config of it, so that engine runs each of them as measured, engine-only kinds included.

    A policy difference that leaves every tuned number meaning the same (which n-gram occurrence is
    continued) is not a blocker: export says it as a warning.
    """
    e = engine_info(engine)
    d = config.draft
    if d.kind == "none" or measured_in == e.key:
        return []
    if d.kind in ENGINE_ONLY_KINDS:
        return [f"{e.display} has no counterpart of llama.cpp's {d.kind.replace('_', '-')} drafter"]
    if d.kind == "hybrid":
        return [f"{e.display} has no hybrid drafter (prompt lookup, then a draft model, in one step)"]
    policy = config.gamma_policy
    if policy != "fixed" and policy not in e.gamma_policies.get(d.kind, ()):
        return [f"{e.display} has no per-step γ policy like '{policy}' for {d.kind.replace('_', ' ')}"]
    if d.kind not in e.kinds:
        if d.kind == "layer_skip":
            return [f"{e.display} has no layer-skip self-speculation"]
        return [
            f"{e.display}'s NGRAM drafts from a token trie over all suffixes shared across requests: "
            f"it has no n-gram sizes, so prompt lookup n={d.ngram_min}..{d.ngram_max} has no counterpart"
        ]
    t = config.threshold
    if d.has_threshold and t > 0:
        if e.threshold_mode is None:
            return [
                f"{e.display} has no draft confidence threshold, and γ={config.gamma} was tuned together "
                f"with t={t:g}: without t it is a config that was never measured"
            ]
        mode = d.threshold_mode or "hf"
        if mode != e.threshold_mode:
            return [
                f"t={t:g} was measured on {_MODE_TEXT[mode]}; {e.display} compares "
                f"{_MODE_TEXT[e.threshold_mode]}, so the same number stops drafting elsewhere"
            ]
    return []


def gamma_policies_for(engine: str, policies: tuple[str, ...]) -> tuple[str, ...]:
    """The policies of `policies` that `engine` runs for some draft kind ("fixed" always)."""
    e = engine_info(engine)
    runs = {p for kinds in e.gamma_policies.values() for p in kinds} | {"fixed"}
    return tuple(p for p in policies if p in runs) or ("fixed",)


def restrict(specs: list[DraftSpec], engine: str) -> tuple[list[DraftSpec], list[str]]:
    """The drafters `engine` can run, each set to that engine's policy, and notes on what changed."""
    e = engine_info(engine)
    out: list[DraftSpec] = []
    notes: list[str] = []
    for s in specs:
        if s.kind not in e.kinds:
            notes.append(f"{s.label}: {e.display} cannot run it, left out of the search")
            continue
        if s.kind == "prompt_lookup":
            lo, hi = s.ngram_min or 1, s.ngram_max or 3
            if e.lookup_ngrams == "down_to_1" and lo != 1:
                notes.append(f"{s.name}: {e.display} always falls back to 1-grams, searched with n={1}..{hi}")
                lo = 1
            if e.lookup_ngrams == "single" and lo != hi:
                notes.append(f"{s.name}: {e.display} matches one n-gram length, searched with n={hi}")
                lo = hi
            s = dataclasses.replace(s, ngram_min=lo, ngram_max=hi, lookup_match=e.lookup_match)
        elif s.has_threshold:
            s = dataclasses.replace(s, threshold_mode=e.threshold_mode)
        out.append(s)
    return out, notes
