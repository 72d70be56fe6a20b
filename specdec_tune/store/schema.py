"""The profile schema: what `specdec-tune run` found best for one target on one accelerator, as
plain dataclasses (`validate` builds them from parsed YAML with errors that name the field
path). Never imports torch.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field, fields
from typing import Any

from ..domain import (
    Anchors,
    CompileTime,
    Costs,
    Metrics,
    Noise,
    Result,
)
from .fields import SCHEMA_VERSION

# runtime.caches.modes.ENGINE_MODES with auto resolved; "llamacpp": costs measured inside llama-server
# (older profiles); "engine": inside another engine's server, the profile's BackendInfo names it
MEASURED_MODES = ("eager", "static", "compiled")
COSTS_MODES = (*MEASURED_MODES, "llamacpp", "engine")


@dataclass
class TargetInfo:
    name: str  # what the user passed (HF id or folder) or "demo"
    path: str  # portable reference (store.refs): demo name, HF id, or "./"/"../" folder from the profile
    revision: str | None  # git commit of the HF snapshot when known
    content_hash: str  # "sha256:" + 16 hex over config + full weight files; 16 bare hex: older format
    dtype: str
    num_params: int


@dataclass
class WorkloadInfo:
    name: str
    prompts: int
    sha256: str  # hash of the prompts (first 16 hex)
    max_new_tokens: int
    temperature: float
    # `run --context-lengths`: the prompt length (target tokens) the profile's best was measured at;
    # None: the workload's own prompts, as written.
    context_length: int | None = None


@dataclass
class SearchInfo:
    sampler: str  # "tpe" or "grid"
    trials: int  # finished trials counted into the study
    failed: int
    pruned: int
    study_name: str
    storage: str
    seed: int
    space: dict[str, Any] = field(default_factory=dict)  # drafts, gamma range, threshold range
    finalists: int = 0  # configs re-measured head to head after the search (0: no final round)
    final_repeats: int = 0  # interleaved repeats of that final round (the most any finalist got)
    # "resolved" (the best is faster than the runner-up beyond the noise) or "tie within noise"
    # (the budget ended first; the fastest of the round was kept); "" before racing existed.
    final_verdict: str = ""
    final_margin: list[float] = field(default_factory=list)  # best / runner-up: ratio, interval lo, hi
    # On a tie: the configs the best could not be told from, simplest first (search.racing).
    final_tied: list[str] = field(default_factory=list)
    outliers: list[str] = field(default_factory=list)  # search trials not believed (above the ceiling)
    budget_s: float | None = None  # the wall-clock budget that sized the search (None: fixed --trials)
    budget_note: str = ""  # what the budget allowed, in words
    # Where the session's wall time went, phase -> seconds (app.session_search.Ledger): the engine's
    # start, the costs, the noise, each batch size's trials and final round, the schedule, exactness.
    time_spent: dict[str, float] = field(default_factory=dict)
    engine: str | None = None  # the serving engine the search was restricted to (`run --for`)


@dataclass
class BatchRow:
    """The answer at one batch size: the best config with B requests in flight (closed loop), each
    draft at its own best gamma, and the cost model's prediction there."""

    batch_size: int
    best: Result  # metrics: speedup over plain batched decoding at this B, tokens/s of both
    per_draft: list[Result] = field(default_factory=list)  # each draft's best measured config
    predicted_speedup: float | None = None  # the cost model's best prediction at this B
    study_name: str = ""
    # Not searched: the cell ("B=1") whose top configs raced head to head here against plain
    # (search.cells.confirm_candidates). None: searched here.
    confirmed_from: str | None = None
    # This row's config against plain at this B in each reference process on the check slice
    # (app.reference, measure.narrow): what `check` judges the row against. Absent in older profiles.
    reference_speedups: list[float] = field(default_factory=list)
    reference_speedup_repeats: list[float] = field(default_factory=list)  # their repeats, one after another


@dataclass
class ContextRow:
    """One cell of the serving envelope (`run --context-lengths`): the best config with prompts of
    about `context_length` target tokens at `batch_size` requests in flight, and what set it."""

    context_length: int  # the prompt length asked for, in the target's own tokens
    batch_size: int
    best: Result  # metrics: speedup over plain decoding at this (B, L), measured head to head
    prompt_tokens: int = 0  # the prompts' mean length as sent (a request alone may be longer than L)
    per_draft: list[Result] = field(default_factory=list)  # each draft's best measured config here
    t_target_ms: float | None = None  # plain decoding's milliseconds per token here: T_target(L)
    predicted_speedup: float | None = None  # the cost model's prediction of `best`, made before measuring it
    study_name: str = ""
    # Not searched: the cell ("B=1", "L=256") whose top configs raced here. None: searched here.
    confirmed_from: str | None = None
    # What a pass measured in this cell (search.budget.trial_size may cut a long length's trial
    # to fewer prompts and shorter replies): `check` re-measures that. None: the profile's workload.
    prompts: int | None = None
    max_new_tokens: int | None = None


@dataclass
class EnvelopeLine:
    """Along L at one batch size: L* (the shortest measured L whose best is plain decoding; None:
    speculation paid at every L measured) and where the best draft kind changes."""

    batch_size: int
    l_star: int | None = None
    kind_changes: list[str] = field(default_factory=list)  # "ngram-simple -> ngram-mod at L 2048"


@dataclass
class CategoryRow:
    """The answer for one category of the workload (`run --per-category`): the best of the search's
    top configs measured on that category's prompts alone, and the overall best measured beside it."""

    category: str
    prompts: int
    best: Result  # metrics: measured on this category's prompts
    overall_speedup: float  # the overall best config, measured in the same run on these prompts
    overall_acceptance_rate: float = 0.0


@dataclass
class BackendInfo:
    """The engine that measured a profile (`check` re-measures in it, `export` and `show` read it).

    Written as the YAML mapping `backend:` without the fields at their defaults, so a profile of our
    own engine keeps its `backend: {}` and an engine backend's reads as it always has (`as_dict`)."""

    name: str = "native"  # a name in backends.base.BACKENDS; an empty mapping is our own engine
    build: dict[str, Any] = field(default_factory=dict)  # package, binary and its sha256 ({}: in process)
    threads: int | None = None  # the engine's threads as measured (None: not the engine's to say)
    exactness: dict[str, Any] = field(default_factory=dict)  # its best config's tokens vs plain at T = 0
    cost_model_error: float | None = None  # median relative error of the predictions, out of sample
    engine_defaults: list[dict[str, Any]] = field(default_factory=list)  # its defaults, raced
    cost_model: dict[str, Any] = field(default_factory=dict)  # the fitted model's errors and reasons
    # An engine run as servers: the program that started each one (export puts it before a config's
    # flags: serving.measured), the measurement's own flags a deployment leaves out, the user's extra
    # engine arguments (passed through to every server), and a server's median start in seconds.
    launcher: list[str] = field(default_factory=list)
    measure_only_args: list[str] = field(default_factory=list)
    engine_args: list[str] = field(default_factory=list)
    start_s: float | None = None
    # The engine's batch-size schedule measured as a config of its own against each fixed γ it mixes
    # (vLLM's num_speculative_tokens_per_batch_size): its draft, tiers, flags, measured rows, and
    # whether it was emitted or where it lost.
    schedule: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The YAML mapping: every field not at its default."""
        default = BackendInfo()
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if getattr(self, f.name) != getattr(default, f.name)
        }


@dataclass
class Profile:
    hardware: dict[str, Any]  # fingerprint from specdec_tune.hardware; must contain "slug"
    target: TargetInfo
    workload: WorkloadInfo
    costs: Costs | None
    search: SearchInfo
    best: Result
    alternatives: list[Result]  # next best, at most 4
    baseline: Metrics  # gamma 0: plain target, speedup 1
    # With `run --batch-sizes`: the best config per batch size, and B* -- the smallest measured
    # batch size where no speculation was fastest (None: speculation won at every measured B).
    batch_table: list[BatchRow] = field(default_factory=list)
    b_star: int | None = None
    predicted_b_star: int | None = None  # the cost model's B* from the cost surface
    category_table: list[CategoryRow] = field(default_factory=list)  # `run --per-category`
    # With `run --context-lengths`: the best config per (batch size, context length) cell, and per
    # batch size where speculation stops paying along L (L*) and where the best draft kind changes.
    context_table: list[ContextRow] = field(default_factory=list)
    envelope: list[EnvelopeLine] = field(default_factory=list)
    # The engine mode the search measured under (runtime.caches.modes; `check` re-measures with it), and
    # any compile that failed there and fell back to the static engine.
    engine_mode: str = "eager"
    compile_fallbacks: list[str] = field(default_factory=list)
    engine_choice: str | None = None  # how `--engine auto` chose (what was compared); None when named
    # The measuring backend (`backend: {}` = our own engine): name, engine build, threads, and how
    # exact the engine's speculation was at T = 0 here. `check` re-measures in the same engine.
    backend: BackendInfo = field(default_factory=BackendInfo)
    # How noisy the machine was when the search ran, and its measured speed (for `check`); absent
    # in older profiles.
    noise: Noise | None = None
    anchors: Anchors | None = None
    # The graphs the engine built over the whole run and the seconds that took, apart from every
    # timing (None under eager, and in older profiles).
    compile: CompileTime | None = None
    versions: dict[str, str] = field(default_factory=dict)  # specdec_tune, torch, transformers, ...
    trials_sha256: str | None = None  # of the trials CSV written with it (store.runfiles); None: older
    created: str = ""  # ISO 8601 UTC, as `created_now` writes it
    schema_version: int = SCHEMA_VERSION


def created_now() -> str:
    """A profile's `created`: now, ISO 8601 UTC to the second ("2026-12-02T07:11:41+00:00"), the
    same for every backend (the llama.cpp profiles wrote "...Z" before)."""
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()
