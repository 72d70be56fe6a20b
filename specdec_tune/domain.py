"""The project's vocabulary, one model per concept: which drafter, a config, what was measured,
the hardware costs. Plain dataclasses every stage shares (runtime builds drafters from a
`DraftSpec`, measure fills `Metrics` and `Costs`, search ranks `Result`s, store writes them).
Pure Python: no torch.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .checkpolicy import CHECK_POLICY

DRAFT_KINDS = (
    "none", "model", "prompt_lookup", "layer_skip", "hybrid",
    "ngram_mod", "ngram_map_k", "ngram_map_k4v", "ngram_cache",
)  # fmt: skip
# Kinds only a serving engine runs (llama.cpp's ngram-mod hash pool, its n-gram maps with one or four
# values per key, its 3-level n-gram cache): the native engine refuses them.
ENGINE_ONLY_KINDS = ("ngram_mod", "ngram_map_k", "ngram_map_k4v", "ngram_cache")
# Kinds whose draft length is the engine's, not a setting: llama.cpp's ngram-cache always drafts up to
# 8 tokens (common/speculative.cpp, build 11434: `n_draft = 8; // TODO get from config?`).
FIXED_GAMMA = {"ngram_cache": 8}
# Drafters with a confidence to threshold (prompt lookup has none; a hybrid's model part has one).
THRESHOLD_KINDS = ("model", "layer_skip", "hybrid")
# How gamma is chosen per step (runtime/drafting/policies.py): fixed, transformers' heuristic, the cost model.
GAMMA_POLICIES = ("fixed", "heuristic", "costmodel")
# Engine policies a drafter can be measured with (see serving/capabilities.py). Prompt lookup: which earlier
# occurrence of the n-gram is continued; confidence stop: which probability the threshold compares.
LOOKUP_MATCHES = ("latest", "earliest")  # latest: this tool's default and llama.cpp; earliest: HF, vLLM
THRESHOLD_MODES = ("hf", "topk10")  # hf: p(token) of the full softmax; topk10: llama.cpp's p-min
# Where a model's weights came from: trained (loaded), or random (a shape, runtime/models/shapes.py: its
# timings are those of the real size, its outputs and so its acceptance mean nothing).
WEIGHTS = ("trained", "random")
# Where a draft's acceptance vector came from: measured here, given (`--acceptance-vector`), copied
# from an earlier costs file or profile ("from:<file name>"), or unknown (random weights, nothing given).
ACCEPTANCE_SOURCES = ("measured", "given", "unknown")
ACCEPTANCE_FROM = "from:"


@dataclass
class DraftSpec:
    """Which drafter proposes tokens. `name` is what tables show and what the search space lists.

    kind: "none" (plain target, gamma 0), "model" (a separate draft model at `path`),
    "prompt_lookup" (n-gram lookup, `ngram_min`..`ngram_max`), "layer_skip" (the target's first
    `layers` layers as the draft), "hybrid" (prompt lookup, then a draft model where the lookup has
    nothing: `ngram_*` and `lookup_match` for the lookup, `path` or `layers` for the model; named
    "hybrid:prompt-lookup+<model>").
    """

    name: str
    kind: str
    path: str | None = None
    ngram_min: int | None = None
    ngram_max: int | None = None
    layers: int | None = None
    lookup_match: str | None = None  # prompt lookup; None = "latest"
    threshold_mode: str | None = None  # model, layer-skip; None = "hf"
    min_draft: int | None = None  # llama.cpp's n_min: draft nothing when fewer would be proposed

    @property
    def label(self) -> str:
        """Short human label of the drafter, e.g. "lookup (n=1..3)" or "skip (8 layers)"."""
        if self.kind == "prompt_lookup":
            policy = ", earliest" if self.lookup_match == "earliest" else ""
            return f"{self.name} (n={self.ngram_min}..{self.ngram_max}{policy})"
        if self.kind == "layer_skip":
            return f"{self.name} ({self.layers} layers)"
        if self.kind == "hybrid":
            return f"{self.name} (lookup n={self.ngram_min}..{self.ngram_max})"
        return self.name

    @property
    def has_threshold(self) -> bool:
        return self.kind in THRESHOLD_KINDS


NO_DRAFT = DraftSpec(name="none", kind="none")


@dataclass
class Config:
    """One point of the search space."""

    draft: DraftSpec
    gamma: int
    threshold: float = 0.0
    gamma_policy: str = "fixed"  # GAMMA_POLICIES; gamma is the most a non-fixed policy drafts

    @property
    def label(self) -> str:
        """Short human label, e.g. "draft-1l γ=4 t=0.30"; the threshold only where it can act."""
        if self.draft.kind == "none":
            return "no speculation"
        text = f"{self.draft.name} γ={self.gamma}"
        # an n-gram draft has no confidence to threshold, so t= would only be noise there
        if self.draft.has_threshold or self.threshold > 0:
            text += f" t={self.threshold:.2f}"
        if self.gamma_policy != "fixed":
            text += f" {self.gamma_policy}"
        return text

    @property
    def key(self) -> tuple:
        """(draft name, gamma, threshold rounded[, gamma policy when not fixed]): equal for configs
        that measure the same thing."""
        key: tuple = (self.draft.name, self.gamma, round(self.threshold, 4))
        return key if self.gamma_policy == "fixed" else (*key, self.gamma_policy)


@dataclass
class Metrics:
    """What was measured for one config, timed against the baseline in the same run."""

    tokens_per_s: float
    baseline_tokens_per_s: float
    speedup: float
    speedup_spread: float  # (max - min) / median of the per-repeat speedups
    acceptance_rate: float  # accepted / proposed draft tokens (0 for gamma 0)
    mean_accepted_len: float  # tokens emitted per target forward
    per_position_acceptance: list[float] = field(default_factory=list)
    repeats: int = 1
    predicted_speedup: float | None = None  # the cost model's prediction, when it has one
    # Set when the final round re-measured this config: its speedup in the search trial, which
    # the final-round `speedup` above replaces (the search value of a winner is biased upwards).
    search_speedup: float | None = None
    # A hybrid drafter's counters per source: {source: {proposed, accepted, acceptance_rate, share}}
    per_source: dict[str, dict[str, float]] = field(default_factory=dict)
    # The per-repeat speedups (each the config's rate over the same repeat's baseline rate) and
    # the bootstrap interval of their median (measure.stats); absent in older profiles.
    speedup_samples: list[float] = field(default_factory=list)
    speedup_interval: list[float] | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Metrics:
        """From `as_dict()` output or a trial's user attributes (other keys are ignored)."""
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in known}
        if "repeats" in kwargs:  # a table column with gaps holds floats
            kwargs["repeats"] = int(kwargs["repeats"])
        kwargs["per_position_acceptance"] = list(kwargs.get("per_position_acceptance") or [])
        if not isinstance(kwargs.get("per_source"), dict):  # absent, or NaN in a trials table
            kwargs["per_source"] = {}
        kwargs["speedup_samples"] = [float(x) for x in _list(kwargs.get("speedup_samples"))]
        interval = _list(kwargs.get("speedup_interval"))
        kwargs["speedup_interval"] = [float(x) for x in interval] if len(interval) == 2 else None
        return cls(**kwargs)


def _list(value: Any) -> list:
    return list(value) if isinstance(value, list | tuple) else []


@dataclass
class Result:
    config: Config
    metrics: Metrics
    # An engine backend: the exact server flags this config ran with (what `export` emits).
    backend_args: list[str] = field(default_factory=list)


@dataclass
class DraftCosts:
    """Measured cost and acceptance of one drafter on this hardware."""

    name: str
    t_draft_ms: float  # per proposed token
    c: float  # t_draft_ms / t_target_ms
    acceptance_rate: float
    acceptance_vector: list[float]  # P(draft token i accepted | 1..i-1 accepted), i = 1..Gamma
    # Clocked inside the real loop of the acceptance pass (gamma = Gamma), where the two models
    # evict each other from the caches: ms per proposed token, and ms per verification forward
    # over `loop_verify_tokens` tokens on average. The cost model prefers these where present.
    loop_t_draft_ms: float | None = None
    loop_verify_ms: float | None = None
    loop_verify_tokens: float | None = None
    weights: str | None = None  # "random" for a shape draft (T_draft is real, acceptance is not)
    # ACCEPTANCE_SOURCES, or "from:<file>"; with "unknown" the vector is empty and nothing is predicted
    acceptance_source: str = "measured"

    @property
    def acceptance_known(self) -> bool:
        return self.acceptance_source != "unknown"


@dataclass
class BatchCosts:
    """Costs with B requests decoding together, at the workload's mid-generation context length."""

    batch_size: int
    t_target_ms: float  # one plain decode step of all B rows (C_ver(B, 0))
    verify_ms: list[
        float
    ]  # C_ver(B, gamma): one target forward over B x (gamma + 1) tokens, gamma = 1..Gamma
    t_draft_ms: dict[str, float] = field(default_factory=dict)  # per draft: ms per draft position, B rows
    # Clocked inside real batched loops over the workload (closed loop at B): the plain loop's
    # wall time per step besides the target forward, and per draft (at gamma 4): the speculative
    # step's time besides forwards and drafting, the verification forward's ms and tokens per row,
    # and the draft's ms per position. The cost model prefers these where present.
    loop_overhead_ms: float | None = None
    step_overhead_ms: dict[str, float] = field(default_factory=dict)
    loop_verify_ms: dict[str, float] = field(default_factory=dict)
    loop_verify_tokens: dict[str, float] = field(default_factory=dict)
    loop_t_draft_ms: dict[str, float] = field(default_factory=dict)
    # The context length the loop terms were clocked at when an envelope carried them from its
    # first length (measure.surface.carried_loop_terms); None: clocked at this surface's own.
    loop_terms_from: int | None = None


@dataclass
class Costs:
    """Hardware costs measured by the profiler (each a median over repeats)."""

    t_target_ms: float
    t_target_spread: float  # relative (max - min) / median
    verify_ms: list[float]  # C_ver(gamma) for gamma = 1..Gamma (index 0 is gamma 1)
    verify_spread: float  # worst relative spread over the curve
    context_len: int
    drafts: list[DraftCosts] = field(default_factory=list)
    copy_bandwidth_gbps: float | None = None
    decode_bandwidth_gbps: float | None = None
    roofline_share: float | None = None  # decode / copy bandwidth
    matmul_tflops: float | None = None
    # Per-token cost of the plain decoding loop besides the forward (T_plain - T_target), and per
    # step of the speculative loop besides draft and verification forwards; see costmodel.
    loop_overhead_ms: float | None = None
    step_overhead_ms: float | None = None
    # The cost surface over batch sizes (empty when only batch size 1 was profiled), and the
    # largest measured B whose verification of one draft token still costs about one decode step.
    batch: list[BatchCosts] = field(default_factory=list)
    memory_bound_until: int | None = None
    # The engine mode every forward above ran under (runtime.caches.modes), and any compile that failed
    # and fell back to the static engine (one line each).
    engine_mode: str = "eager"
    compile_fallbacks: list[str] = field(default_factory=list)
    # How `--engine auto` chose the mode (what was compared, the choice); None when it was named.
    engine_choice: str | None = None
    # "random" when the target was built from a shape's config (`profile --shape`): the timings are
    # those of that architecture at its real size, no acceptance was measured against it.
    weights: str = "trained"
    shape: str | None = None  # the target's shape name when its weights are random
    # The compiled engine's graph builds while these were measured, apart from every timing; None
    # under eager and in older files.
    compile: CompileTime | None = None
    # llama.cpp: C_ver(γ) as prompt processing measured it, before `verify_ms` anchored it at
    # T_target; its slope is what a drafted token's verification costs more at a longer context
    # (search.enginepredictor). None in our engine and in older files.
    verify_raw_ms: list[float] | None = None

    def at_batch(self, batch_size: int) -> BatchCosts | None:
        return next((b for b in self.batch if b.batch_size == batch_size), None)

    def draft(self, name: str) -> DraftCosts | None:
        return next((d for d in self.drafts if d.name == name), None)


@dataclass
class CompileTime:
    """What building the engine's graphs cost (runtime.caches.modes: one graph per model, row count
    and input width), measured apart from the timings, which never include it. Static engine: 0."""

    graphs: int
    compile_s: float


@dataclass
class Noise:
    """How noisy the machine was while measuring (measure.noise): the spread of repeated plain
    passes, and what the OS said over that window (None where it could not tell)."""

    plain_pass_s: float  # median seconds of one plain pass over the workload
    plain_pass_cv: float  # their coefficient of variation (stdev / mean)
    plain_passes: int
    cpus: int
    load_avg: float | None = None  # 1-minute load average
    steal_share: float | None = None  # share of CPU time the hypervisor took over the window
    others_cpu_share: float | None = None  # share of all CPUs other processes used over the window
    busiest: list[str] = field(default_factory=list)  # the busiest other processes, in words
    repeats_needed: int = 1  # interleaved repeats to resolve a 5 % difference at this noise
    # What the OS said over the whole search and final round (absent in older profiles): a load
    # that starts after the noise passes shows here.
    during_search: MachineWindow | None = None


@dataclass
class MachineWindow:
    """What the OS said over a stretch of a run (measure.noise.os_since); None where it could not tell."""

    seconds: float
    load_avg: float | None = None
    steal_share: float | None = None
    others_cpu_share: float | None = None
    busiest: list[str] = field(default_factory=list)
    busy: bool = False  # other processes or steal beyond checkpolicy's busy_* shares (measure.noise)


@dataclass
class DecodeAnchorSpec:
    """The decode anchor's shape (measure.decode_anchor): per weight shape of the target, [rows,
    columns, how many], in the order the target has them, and the target's dtype."""

    matrices: list[list[int]]
    dtype: str = "float32"


@dataclass
class Anchors:
    """Measured performance of this machine, so `check` can tell other (slower) hardware from a
    regression: the hardware slug names a kind of machine, not its speed."""

    plain_tokens_per_s: float  # the target's plain decoding over the workload (batch size 1)
    copy_bandwidth_gbps: float | None = None  # a large device-to-device copy
    # a small float32 matmul (measure.anchors); with the copy, the machine anchors `check` compares
    # before judging. Absent in older profiles.
    matmul_gflops: float | None = None
    # The best config against plain decoding in fresh processes after the run, measured the way
    # `check` measures (app.reference): one median tokens/s per process. `check` judges tokens/s
    # against these rather than the final round's, which came from the process that ran the search.
    reference_tokens_per_s: list[float] = field(default_factory=list)
    reference_baseline_tokens_per_s: list[float] = field(default_factory=list)
    reference_matmul_gflops: float | None = None  # the matmul anchor in those processes (median)
    # Those processes' speedups (one median each; absent in older profiles). The same config in
    # fresh processes of one quiet VM measured 2.04x or 2.43x, each process stable within 2 %: the
    # final round's speedup is one process's, so `check` judges the speedup against these.
    reference_speedups: list[float] = field(default_factory=list)
    # The engine threads those processes measured with, each pinned to the core other processes
    # used least (measure.narrow, the check slice: 1); None where they ran as the run did (older
    # profiles). `check` measures on the same slice, so a load on other cores does not reach it.
    reference_threads: int | None = None
    # On the slice, every repeat's speedup of those processes, one after another: `check` judges the
    # speedup against these. The process level there is within the repeats' own spread (5-repeat
    # medians of one config 1.98-2.07 on both cores, stop 59), so a median per process would only
    # throw away two thirds of what was measured.
    reference_speedup_repeats: list[float] = field(default_factory=list)
    # The decode anchor's shape (absent in older profiles), and per reference process the median of
    # its repeats' plain tokens/s divided by the decode anchor's steps/s, timed interleaved prompt
    # by prompt: the machine's own speed cancels in it, so `check` judges the plain rate by it.
    decode_anchor: DecodeAnchorSpec | None = None
    reference_plain_per_anchor: list[float] = field(default_factory=list)
    # The machine itself (measure.hardware.machine_id; absent in older profiles): `check` judges
    # absolute rates only on the same one, since two VMs of one slug differ in them.
    machine: str | None = None

    @property
    def has_reference(self) -> bool:
        """Whether `check` judges against the reference: at least the policy's
        `min_reference_processes` quiet ones (one alone carries no spread between processes)."""
        return min(len(self.reference_tokens_per_s), len(self.reference_baseline_tokens_per_s)) >= (
            CHECK_POLICY.min_reference_processes
        )

    @property
    def sliced(self) -> bool:
        """Whether `check` measures on the check slice (measure.narrow): the reference was measured
        there, by at least the policy's `min_reference_processes` quiet processes."""
        return self.reference_threads is not None and len(self.reference_speedups) >= (
            CHECK_POLICY.min_reference_processes
        )

    @property
    def has_anchor_reference(self) -> bool:
        """Whether `check` judges the plain rate per decode-anchor step (measure.decode_anchor)."""
        return self.decode_anchor is not None and len(self.reference_plain_per_anchor) >= (
            CHECK_POLICY.min_reference_processes
        )


def slugify(text: str) -> str:
    """Lowercase, filesystem-safe slug of the last path component; keeps dots and dashes.

    "meta-llama/Llama-3.1-8B-Instruct" -> "llama-3.1-8b-instruct"; "NVIDIA H200" -> "nvidia-h200".
    """
    last = re.split(r"[/\\]", text.strip().rstrip("/\\"))[-1]
    slug = re.sub(r"[^a-z0-9.\-]+", "-", last.lower())
    slug = re.sub(r"-{2,}", "-", slug).strip("-.")
    # "." / ".." alone would be path traversal, and an empty name is no file name at all.
    return slug or "unknown"
