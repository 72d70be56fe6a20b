"""Read a profile: build the `schema` dataclasses from parsed YAML and check what the values mean
(ranges, names, the search space, the costs), with errors that name the field path, e.g.
'best.config.gamma'. Never imports torch.
"""

from __future__ import annotations

import re
from typing import Any

from ..domain import (
    ACCEPTANCE_FROM,
    ACCEPTANCE_SOURCES,
    DRAFT_KINDS,
    GAMMA_POLICIES,
    LOOKUP_MATCHES,
    THRESHOLD_MODES,
    WEIGHTS,
    CompileTime,
    Costs,
    Metrics,
    Result,
)
from ..errors import SpecDecError
from ..limits import (
    MAX_BATCH_SIZE,
    MAX_CONTEXT_LEN,
    MAX_GAMMA,
    MAX_LAYERS,
    MAX_NEW_TOKENS,
    MAX_PARAMS,
    MAX_PROMPTS,
    MAX_REPEATS,
    MAX_TRIALS,
    THRESHOLD_RANGE,
    threshold_ok,
)
from ..serving.capabilities import ENGINES
from .fields import MAX_ITEMS, READABLE_VERSIONS, SCHEMA_VERSION, check_plain, convert, describe, field_error
from .schema import COSTS_MODES, MEASURED_MODES, Profile


def profile_from_dict(d: Any) -> Profile:
    """Build and validate a Profile from plain data (parsed YAML).

    Raises SpecDecError naming the offending field path, e.g. 'best.config.gamma'.
    """
    if not isinstance(d, dict):
        raise SpecDecError(f"a profile must be a YAML mapping at the top level, got {describe(d)}")
    if "schema_version" not in d:
        # schema_version is the last key written, so a file without it was most likely cut off:
        # converting the rest names the first field that went missing
        convert(d, Profile, "")
        raise SpecDecError(
            f"profile field 'schema_version' is missing: it is the last line specdec-tune writes, so the "
            f"file may be cut off (this specdec-tune reads schema version {SCHEMA_VERSION})"
        )
    version = d["schema_version"]
    if version not in READABLE_VERSIONS or isinstance(version, bool):
        raise SpecDecError(
            f"profile schema_version {version!r} is not supported: this specdec-tune reads schema version "
            f"{' and '.join(map(str, READABLE_VERSIONS))} (re-run `specdec-tune run` to write a current profile, or install the "
            f"specdec-tune that wrote it)"
        )
    profile = convert(d, Profile, "")
    _validate(profile)
    return profile


def _cell_name(value: str, where: str) -> None:
    """A cell as `confirmed_from` names it: B=N or L=N, comma-separated."""
    if not isinstance(value, str) or not re.fullmatch(r"[BL]=\d{1,7}(, [BL]=\d{1,7})?", value):
        raise field_error(where, "must name a cell as B=N or L=N", value)


def _validate_envelope(p: Profile) -> None:
    if p.workload.context_length is not None:
        _in_range(p.workload.context_length, 1, MAX_CONTEXT_LEN, "workload.context_length")
    cells: set[tuple[int, int]] = set()
    for i, row in enumerate(p.context_table):
        where = f"context_table[{i}]"
        _in_range(row.context_length, 1, MAX_CONTEXT_LEN, f"{where}.context_length")
        _in_range(row.batch_size, 1, MAX_BATCH_SIZE, f"{where}.batch_size")
        _in_range(row.prompt_tokens, 0, MAX_CONTEXT_LEN, f"{where}.prompt_tokens")
        if row.prompts is not None:
            _in_range(row.prompts, 1, MAX_PROMPTS, f"{where}.prompts")
        if row.max_new_tokens is not None:
            _in_range(row.max_new_tokens, 1, MAX_NEW_TOKENS, f"{where}.max_new_tokens")
        cell = (row.batch_size, row.context_length)
        if cell in cells:
            raise field_error(where, "must not repeat an earlier row's (batch_size, context_length)", cell)
        cells.add(cell)
        if row.t_target_ms is not None:
            _positive(row.t_target_ms, f"{where}.t_target_ms")
        if row.confirmed_from is not None:
            _cell_name(row.confirmed_from, f"{where}.confirmed_from")
        _validate_result(row.best, f"{where}.best")
        for j, r in enumerate(row.per_draft):
            _validate_result(r, f"{where}.per_draft[{j}]")
    for i, line in enumerate(p.envelope):
        _in_range(line.batch_size, 1, MAX_BATCH_SIZE, f"envelope[{i}].batch_size")
        if line.l_star is not None:
            _in_range(line.l_star, 1, MAX_CONTEXT_LEN, f"envelope[{i}].l_star")


def _validate(p: Profile) -> None:
    _validate_hardware(p.hardware)
    _validate_space(p.search.space)
    _at_least(p.workload.temperature, 0.0, "workload.temperature")
    _in_range(p.workload.temperature, 0.0, 100.0, "workload.temperature")
    _in_range(p.workload.max_new_tokens, 1, MAX_NEW_TOKENS, "workload.max_new_tokens")
    _in_range(p.workload.prompts, 1, MAX_PROMPTS, "workload.prompts")
    _in_range(p.target.num_params, 0, MAX_PARAMS, "target.num_params")
    for name in ("trials", "failed", "pruned"):
        _in_range(getattr(p.search, name), 0, MAX_TRIALS, f"search.{name}")
    for name in (
        "alternatives",
        "batch_table",
        "category_table",
        "context_table",
        "envelope",
        "compile_fallbacks",
    ):
        if len(getattr(p, name)) > MAX_ITEMS:
            raise field_error(name, f"must have at most {MAX_ITEMS} entries", getattr(p, name))
    _one_of(p.engine_mode, MEASURED_MODES, "engine_mode")
    _validate_result(p.best, "best")
    for i, alt in enumerate(p.alternatives):
        _validate_result(alt, f"alternatives[{i}]")
    _validate_metrics(p.baseline, "baseline")
    seen: set[int] = set()
    for i, row in enumerate(p.batch_table):
        where = f"batch_table[{i}]"
        _in_range(row.batch_size, 1, MAX_BATCH_SIZE, f"{where}.batch_size")
        if row.batch_size in seen:
            raise field_error(
                f"{where}.batch_size", "must not repeat an earlier row's batch size", row.batch_size
            )
        seen.add(row.batch_size)
        if row.confirmed_from is not None:
            _cell_name(row.confirmed_from, f"{where}.confirmed_from")
        _validate_result(row.best, f"{where}.best")
        for j, r in enumerate(row.per_draft):
            _validate_result(r, f"{where}.per_draft[{j}]")
        _positives(row, ("reference_speedups", "reference_speedup_repeats"), where)
    categories: set[str] = set()
    for i, crow in enumerate(p.category_table):
        where = f"category_table[{i}]"
        if not crow.category.strip() or crow.category in categories:
            raise field_error(f"{where}.category", "must be a non-empty, unrepeated name", crow.category)
        categories.add(crow.category)
        _in_range(crow.prompts, 1, MAX_PROMPTS, f"{where}.prompts")
        _at_least(crow.overall_speedup, 0.0, f"{where}.overall_speedup")
        _probability(crow.overall_acceptance_rate, f"{where}.overall_acceptance_rate")
        _validate_result(crow.best, f"{where}.best")
    _validate_envelope(p)
    for name in ("b_star", "predicted_b_star"):
        if getattr(p, name) is not None:
            _in_range(getattr(p, name), 1, MAX_BATCH_SIZE, name)
    _in_range(p.search.finalists, 0, MAX_TRIALS, "search.finalists")
    _in_range(p.search.final_repeats, 0, MAX_REPEATS, "search.final_repeats")
    if p.search.engine is not None:
        _one_of(p.search.engine, ENGINES, "search.engine")
    if p.costs is not None:
        validate_costs(p.costs)
    if p.noise is not None:
        _at_least(p.noise.plain_pass_s, 0.0, "noise.plain_pass_s")
        _at_least(p.noise.plain_pass_cv, 0.0, "noise.plain_pass_cv")
        _at_least(p.noise.repeats_needed, 1, "noise.repeats_needed")
        if p.noise.during_search is not None:
            _at_least(p.noise.during_search.seconds, 0.0, "noise.during_search.seconds")
    if p.compile is not None:
        validate_compile(p.compile, "compile")
    if p.anchors is not None:
        _positive(p.anchors.plain_tokens_per_s, "anchors.plain_tokens_per_s")
        for name in ("copy_bandwidth_gbps", "matmul_gflops", "reference_matmul_gflops"):
            if getattr(p.anchors, name) is not None:
                _positive(getattr(p.anchors, name), f"anchors.{name}")
        lists = ("reference_tokens_per_s", "reference_baseline_tokens_per_s", "reference_speedups")
        _positives(p.anchors, (*lists, "reference_speedup_repeats", "reference_plain_per_anchor"), "anchors")
        if p.anchors.reference_threads is not None:
            _in_range(p.anchors.reference_threads, 1, 4096, "anchors.reference_threads")
        if p.anchors.decode_anchor is not None:
            validate_decode_anchor(p.anchors.decode_anchor, "anchors.decode_anchor")


# The dtypes a decode anchor is built in (names of torch dtypes; validating imports no torch).
ANCHOR_DTYPES = ("float32", "float16", "bfloat16", "float64")
MAX_ANCHOR_DIM = 2**20
MAX_ANCHOR_ELEMENTS = 2**28  # one matrix (1 GiB in float32: a 70B model's embedding is 2**30 / 4)
MAX_ANCHOR_MATRICES = 2**14  # per step, all shapes together


def validate_decode_anchor(spec: Any, path: str) -> None:
    """Shapes [rows, columns, count] of positive ints (at most MAX_ITEMS of them, bounded so a
    hand-edited profile cannot make `check` allocate or loop without end), a float dtype."""
    _one_of(spec.dtype, ANCHOR_DTYPES, f"{path}.dtype")
    if not 1 <= len(spec.matrices) <= MAX_ITEMS:
        raise field_error(f"{path}.matrices", f"must have 1 to {MAX_ITEMS} entries", spec.matrices)
    for i, m in enumerate(spec.matrices):
        if len(m) != 3:
            raise field_error(f"{path}.matrices[{i}]", "must be [rows, columns, count]", m)
        for j, n in enumerate(m):
            _in_range(n, 1, MAX_ANCHOR_DIM, f"{path}.matrices[{i}][{j}]")
        if m[0] * m[1] > MAX_ANCHOR_ELEMENTS:
            raise field_error(f"{path}.matrices[{i}]", f"must have at most {MAX_ANCHOR_ELEMENTS} elements", m)
    total = sum(m[2] for m in spec.matrices)
    if total > MAX_ANCHOR_MATRICES:
        raise field_error(f"{path}.matrices", f"must count at most {MAX_ANCHOR_MATRICES} matrices", total)


def validate_costs(c: Costs, path: str = "costs") -> None:
    """The measured costs' ranges (a profile's `costs`, or a costs file's)."""
    _positive(c.t_target_ms, f"{path}.t_target_ms")
    _in_range(c.context_len, 0, MAX_CONTEXT_LEN, f"{path}.context_len")
    if len(c.verify_ms) > MAX_GAMMA:
        raise field_error(f"{path}.verify_ms", f"must have at most {MAX_GAMMA} entries", c.verify_ms)
    if len(c.drafts) > MAX_ITEMS:
        raise field_error(f"{path}.drafts", f"must have at most {MAX_ITEMS} entries", c.drafts)
    for i, v in enumerate(c.verify_ms):
        _positive(v, f"{path}.verify_ms[{i}]")
    for name in ("loop_overhead_ms", "step_overhead_ms"):
        if getattr(c, name) is not None:
            _at_least(getattr(c, name), 0.0, f"{path}.{name}")
    _one_of(c.engine_mode, COSTS_MODES, f"{path}.engine_mode")
    if c.compile is not None:
        validate_compile(c.compile, f"{path}.compile")
    _one_of(c.weights, WEIGHTS, f"{path}.weights")
    if c.weights == "random" and not c.shape:
        raise field_error(f"{path}.shape", "must name the shape random weights were built from", c.shape)
    for i, dc in enumerate(c.drafts):
        where = f"{path}.drafts[{i}]"
        _at_least(dc.t_draft_ms, 0.0, f"{where}.t_draft_ms")
        _probability(dc.acceptance_rate, f"{where}.acceptance_rate")
        for j, a in enumerate(dc.acceptance_vector):
            _probability(a, f"{where}.acceptance_vector[{j}]")
        if dc.weights is not None:
            _one_of(dc.weights, WEIGHTS, f"{where}.weights")
        source = dc.acceptance_source
        if source not in ACCEPTANCE_SOURCES and not (
            source.startswith(ACCEPTANCE_FROM) and source != ACCEPTANCE_FROM
        ):
            raise field_error(
                f"{where}.acceptance_source",
                f"must be one of {', '.join(ACCEPTANCE_SOURCES)} or {ACCEPTANCE_FROM}<file>",
                source,
            )


def validate_compile(c: CompileTime, path: str) -> None:
    _at_least(c.graphs, 0, f"{path}.graphs")
    _at_least(c.compile_s, 0.0, f"{path}.compile_s")


def _one_of(value: str, allowed: tuple[str, ...], path: str) -> None:
    if value not in allowed:
        raise field_error(path, f"must be one of {', '.join(allowed)}", value)


def _validate_result(r: Result, path: str) -> None:
    d = r.config.draft
    where = f"{path}.config.draft"
    _one_of(d.kind, DRAFT_KINDS, f"{where}.kind")
    if d.kind == "model" and not d.path:
        raise field_error(
            f"{where}.path", "must name the draft model folder or HF id for kind 'model'", d.path
        )
    if d.kind in ("prompt_lookup", "hybrid"):
        for name in ("ngram_min", "ngram_max"):
            v = getattr(d, name)
            if v is None or not 1 <= v <= MAX_NEW_TOKENS:
                raise field_error(
                    f"{where}.{name}", f"must be an int in 1..{MAX_NEW_TOKENS} for kind '{d.kind}'", v
                )
        if d.ngram_min > d.ngram_max:
            raise field_error(f"{where}.ngram_min", f"must be <= ngram_max ({d.ngram_max})", d.ngram_min)
    if d.lookup_match is not None:
        _one_of(d.lookup_match, LOOKUP_MATCHES, f"{where}.lookup_match")
    if d.threshold_mode is not None:
        _one_of(d.threshold_mode, THRESHOLD_MODES, f"{where}.threshold_mode")
    if d.kind == "layer_skip" and (d.layers is None or d.layers < 1):
        raise field_error(f"{where}.layers", "must be an int >= 1 for kind 'layer_skip'", d.layers)
    if d.layers is not None:
        _in_range(d.layers, 0, MAX_LAYERS, f"{where}.layers")
    for name in ("ngram_min", "ngram_max"):
        if getattr(d, name) is not None:
            _in_range(getattr(d, name), 0, MAX_NEW_TOKENS, f"{where}.{name}")
    gamma_path = f"{path}.config.gamma"
    if d.kind == "none":
        if r.config.gamma != 0:
            raise field_error(gamma_path, "must be 0 for draft kind 'none'", r.config.gamma)
    else:
        if not 1 <= r.config.gamma <= MAX_GAMMA:
            raise field_error(gamma_path, f"must be an int in 1..{MAX_GAMMA}", r.config.gamma)
    if d.kind == "hybrid" and not (d.path or d.layers):
        raise field_error(
            f"{where}.path", "must name the draft model (or set layers) for kind 'hybrid'", d.path
        )
    _one_of(r.config.gamma_policy, GAMMA_POLICIES, f"{path}.config.gamma_policy")
    t = r.config.threshold
    if not threshold_ok(t):
        raise field_error(f"{path}.config.threshold", f"must be a number in {THRESHOLD_RANGE}", t)
    _validate_metrics(r.metrics, f"{path}.metrics")


def _validate_metrics(m: Metrics, path: str) -> None:
    _at_least(m.tokens_per_s, 0.0, f"{path}.tokens_per_s")
    _at_least(m.baseline_tokens_per_s, 0.0, f"{path}.baseline_tokens_per_s")
    _at_least(m.speedup, 0.0, f"{path}.speedup")
    _at_least(m.speedup_spread, 0.0, f"{path}.speedup_spread")
    _probability(m.acceptance_rate, f"{path}.acceptance_rate")
    _at_least(m.mean_accepted_len, 0.0, f"{path}.mean_accepted_len")
    for i, a in enumerate(m.per_position_acceptance):
        _probability(a, f"{path}.per_position_acceptance[{i}]")
    _in_range(m.repeats, 1, MAX_REPEATS, f"{path}.repeats")
    if len(m.per_position_acceptance) > MAX_GAMMA:
        raise field_error(
            f"{path}.per_position_acceptance",
            f"must have at most {MAX_GAMMA} entries",
            m.per_position_acceptance,
        )
    if m.search_speedup is not None:
        _at_least(m.search_speedup, 0.0, f"{path}.search_speedup")
    for i, x in enumerate(m.speedup_samples):
        _at_least(x, 0.0, f"{path}.speedup_samples[{i}]")
    iv = m.speedup_interval
    if iv is not None and (len(iv) != 2 or not 0 <= iv[0] <= iv[1]):
        raise field_error(f"{path}.speedup_interval", "must be [lo, hi] with 0 <= lo <= hi", iv)


def _at_least(value: float, low: float, path: str) -> None:
    if value < low:
        kind = "an int" if isinstance(low, int) else "a number"
        raise field_error(path, f"must be {kind} >= {low}", value)


def _positives(obj: Any, names: tuple[str, ...], where: str) -> None:
    """Every number of each list `names` of `obj` positive (`where.name[i]` in the error)."""
    for name in names:
        for i, x in enumerate(getattr(obj, name)):
            _positive(x, f"{where}.{name}[{i}]")


def _in_range(value: float, low: float, high: float, path: str) -> None:
    if not low <= value <= high:
        kind = "an int" if isinstance(low, int) else "a number"
        raise field_error(path, f"must be {kind} in {low}..{high}", value)


def _validate_hardware(hw: dict[str, Any]) -> None:
    """The fingerprint is free-form (it grows with the hardware probed), but only plain values."""
    slug = hw.get("slug")
    if not isinstance(slug, str) or not slug:
        raise field_error("hardware.slug", "must be a non-empty string", slug)
    if len(hw) > MAX_ITEMS:
        raise field_error("hardware", f"must have at most {MAX_ITEMS} entries", hw)
    for k, v in hw.items():
        check_plain(v, f"hardware.{k}", depth=1)


_SPACE_LISTS = ("drafts", "threshold_drafts", "gamma_policies")


def _validate_space(space: dict[str, Any]) -> None:
    """search.space as search.space.search_space writes it; keys added later stay plain values."""
    if len(space) > MAX_ITEMS:
        raise field_error("search.space", f"must have at most {MAX_ITEMS} entries", space)
    for key in _SPACE_LISTS:
        if key in space:
            value = space[key]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise field_error(f"search.space.{key}", "must be a list of names", value)
    if "gamma" in space:
        g = space["gamma"]
        if not isinstance(g, list) or len(g) != 2 or not all(_int_in(v, 0, MAX_GAMMA) for v in g):
            raise field_error("search.space.gamma", f"must be [low, high] within 0..{MAX_GAMMA}", g)
    if "threshold" in space:
        t = space["threshold"]
        ok = isinstance(t, list) and 2 <= len(t) <= 3
        if not ok or not all(
            isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v <= 1 for v in t
        ):
            raise field_error("search.space.threshold", "must be [low, high(, step)] within 0..1", t)
    for k, v in space.items():
        check_plain(v, f"search.space.{k}", depth=1)


def _int_in(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _positive(value: float, path: str) -> None:
    if value <= 0:
        raise field_error(path, "must be a number > 0", value)


def _probability(value: float, path: str) -> None:
    if not 0.0 <= value <= 1.0:
        raise field_error(path, "must be a number in [0, 1]", value)
