"""Per-category answers: the workload split by category, the profile's top configs measured on each
category's prompts alone (`run --per-category`), and a config's acceptance and speedup per
category (`bench` on a workload with categories)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..backends.base import Purpose, open_session
from ..domain import NO_DRAFT, Config, Metrics, Result
from ..errors import SpecDecError
from ..limits import check_count
from ..runtime.workloads import load_workload, stratified
from ..store.refs import resolve_ref
from ..store.runfiles import rewrite_profile
from ..store.schema import CategoryRow
from ..store.yamlio import load_profile
from .common import Models, Progress

UNCATEGORISED = "(none)"


def split_by_category(workload: Any, case: Any) -> dict[str, Any]:
    """{category: the Case of its prompts}, in the order categories first appear."""
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(workload.prompts):
        groups.setdefault(p.category or UNCATEGORISED, []).append(i)
    return {
        name: dataclasses.replace(
            case, prompts=[case.prompts[i] for i in idx], max_new_tokens=[case.max_new_tokens[i] for i in idx]
        )
        for name, idx in groups.items()
    }


def _require_two(names: list[str], workload: str) -> None:
    if len(names) < 2:
        raise SpecDecError(
            f"per-category tuning needs prompts of at least two categories; workload '{workload}' "
            f"with these prompts has {', '.join(names)} only (use --workload general, or more --prompts)"
        )


def _categories(s: Any) -> dict[str, Any]:
    cases = split_by_category(s.workload, s.case)
    _require_two(list(cases), s.workload.name)
    return cases


def check_categories(models: Models) -> None:
    """Fail before minutes of tuning when the workload's chosen prompts have fewer than two
    categories (reads the workload only, loads no model)."""
    if models.prompt is not None:
        raise SpecDecError("--per-category needs a workload with categories, not a single --prompt")
    wl = load_workload(models.workload)
    if models.prompts is not None:
        wl.prompts = stratified(wl.prompts, models.prompts)
    _require_two(list(dict.fromkeys(p.category or UNCATEGORISED for p in wl.prompts)), wl.name)


def candidates(profile: Any, top: int) -> list[Result]:
    """The overall best first, then the next best configs of the profile (distinct, speculative)."""
    out = [profile.best]
    for r in profile.alternatives:
        if len(out) < top and r.config.gamma > 0 and r.config.key != profile.best.config.key:
            out.append(r)
    return out


def per_category(
    models: Models,
    profile_path: Path,
    top: int = 4,
    repeats: int = 3,
    seed: int = 0,
    progress: Progress | None = None,
) -> Any:
    """Measure the profile's `top` configs on each category's prompts, in one interleaved run per
    category through the backend's session, and write the per-category table into the profile.
    Returns the updated Profile."""
    check_count(top, "--per-category candidates")
    profile = load_profile(profile_path)
    folder = Path(profile_path).parent
    chosen = candidates(profile, top)
    drafts: dict[str, Any] = {}
    for r in chosen:
        d = r.config.draft
        if d.kind != "none" and d.name not in drafts:
            drafts[d.name] = dataclasses.replace(d, path=resolve_ref(d.path, folder) if d.path else None)
    models = dataclasses.replace(models, drafts=list(drafts.values()))
    progress = progress or Progress()
    rows = []
    with open_session(models, Purpose("check", costs=profile.costs)) as s:
        cases = _categories(s)
        by_name = {spec.name: spec for spec in s.specs}
        configs = [
            dataclasses.replace(r.config, draft=by_name.get(r.config.draft.name, r.config.draft))
            for r in chosen
        ]
        for i, (name, case) in enumerate(cases.items()):
            progress.stage(f"category {name}", i / len(cases))
            measured = s.measure(configs, case, 1, repeats, seed)
            speedup, j = max((m.metrics.speedup, j) for j, m in enumerate(measured))
            if speedup > 1.0:
                best = Result(chosen[j].config, measured[j].metrics)
            else:  # nothing beat plain decoding on these prompts
                best = Result(Config(NO_DRAFT, 0, 0.0), _baseline(measured[0].metrics))
            overall = measured[0].metrics
            rows.append(CategoryRow(name, len(case.prompts), best, overall.speedup, overall.acceptance_rate))
    profile.category_table = rows
    rewrite_profile(profile, profile_path)
    return profile


def _baseline(m: Metrics) -> Metrics:
    rate = m.baseline_tokens_per_s
    return Metrics(rate, rate, 1.0, 0.0, 0.0, 1.0, repeats=m.repeats)


def bench_categories(s: Any, config: Config, repeats: int, seed: int) -> list[dict[str, Any]]:
    """Acceptance and speedup of one config per category ([] for a workload of one category),
    measured through session `s` (backends.base.MeasuringSession) on each category's prompts."""
    cases = split_by_category(s.workload, s.case)
    if len(cases) < 2:
        return []
    out = []
    for name, case in cases.items():
        (m,) = s.measure([config], case, 1, repeats, seed)
        out.append(
            {
                "category": name,
                "prompts": len(case.prompts),
                "speedup": m.metrics.speedup,
                "acceptance_rate": m.metrics.acceptance_rate,
                "mean_accepted_len": m.metrics.mean_accepted_len,
                "per_source": m.metrics.per_source,
            }
        )
    return out
