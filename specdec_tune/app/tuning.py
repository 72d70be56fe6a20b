"""The main use case: profile the costs, search, and write the winning profile."""

from __future__ import annotations

import datetime
import platform
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from .. import __version__
from ..domain import DraftSpec
from ..errors import SpecDecError
from ..search.space import TuneSettings
from ..store.schema import Profile
from .common import Models, Progress, check_writable, drafter_pool, measure_costs

# ----------------------------------------------------------------------------------------- tune


@dataclass
class TuneOutcome:
    profile: Profile
    path: Path  # the profile YAML written
    trials_csv: Path  # one row per trial, beside it
    result: Any  # search.results.TuneResult


def tune(
    models: Models,
    settings: TuneSettings | None = None,
    layer_skip: list[int] | None = None,
    costs_file: Path | None = None,
    no_profile: bool = False,
    out: Path | None = None,
    progress: Progress | None = None,
) -> TuneOutcome:
    """Profile the costs, search, and write the winning profile (default
    `profiles/<hardware>/<target>.yaml`) with the trials CSV beside it."""
    import pandas as pd

    from ..measure.hardware import hardware_info, same_hardware
    from ..runtime.models import content_hash, slugify
    from ..search.tuner import tune as run_search
    from ..store.atomic import atomic_write_text
    from ..store.refs import make_portable
    from ..store.yamlio import load_costs, save_profile

    settings = settings or TuneSettings()
    progress = progress or Progress()
    if out is not None:
        check_writable(out)
    s = models.open()
    specs = list(s.specs) + [
        DraftSpec(name=f"layer-skip-{k}", kind="layer_skip", layers=k) for k in layer_skip or []
    ]
    if settings.engine is not None:  # `run --for`: what that engine runs, with its policies
        from ..engines import restrict

        specs, notes = restrict(specs, settings.engine)
        s.specs = [x for x in specs if x.kind != "layer_skip"]  # the drafts the costs profile measures
        for n in notes:
            progress.note(n)
    hw = hardware_info(s.device)
    out = out or Path("profiles") / hw["slug"] / f"{slugify(s.target.name)}.yaml"
    check_writable(out)
    pool = drafter_pool(s, specs)
    costs = None
    if costs_file is not None:
        costs, costs_hw = load_costs(costs_file)
        if not same_hardware(costs_hw, hw):
            raise SpecDecError(f"{costs_file} was measured on {costs_hw.get('slug')}, this is {hw['slug']}")
    elif not no_profile:
        costs = measure_costs(s, pool, settings.max_gamma, 5, progress)
    key = {
        "specdec_tune": __version__,
        "hardware": hw["slug"],
        "target_slug": slugify(s.target.name),
        "target": content_hash(s.target.path),
        "workload": s.workload.sha256,
        "prompts": len(s.case.prompts),
        "max_new_tokens": s.case.max_new_tokens,
        "temperature": s.case.temperature,
        "dtype": s.target.dtype,
        "repeats": settings.repeats,
    }
    result = run_search(
        s.target.model, specs, s.case, settings, costs, pool, key, progress.trial, progress.final
    )
    profile = make_profile(result, settings, hw, s.target, s.workload, s.case, costs)
    # models named so the profile works from any folder and machine (store.refs)
    profile = make_portable(profile, out, models.target or s.target.name)
    save_profile(profile, out)
    csv_path = out.with_suffix(".trials.csv")
    atomic_write_text(csv_path, pd.DataFrame(result.rows).to_csv(index=False))
    return TuneOutcome(profile, out, csv_path, result)


def make_profile(
    result: Any,
    settings: TuneSettings,
    hardware: dict[str, Any],
    target: Any,
    workload: Any,
    case: Any,
    costs: Any,
) -> Profile:
    """The profile of a finished search (target: runtime.models.LoadedModel, workload: Workload)."""
    from ..runtime.models import content_hash
    from ..store.refs import storage_for_record
    from ..store.schema import SearchInfo, TargetInfo, WorkloadInfo

    versions = {"specdec_tune": __version__, "python": platform.python_version()}
    for pkg in ("torch", "transformers", "optuna"):
        try:
            versions[pkg] = version(pkg)
        except PackageNotFoundError:
            versions[pkg] = "unknown"
    return Profile(
        hardware=hardware,
        target=TargetInfo(
            name=target.name,
            path=target.path,
            revision=target.revision,
            content_hash=content_hash(target.path),
            dtype=target.dtype,
            num_params=target.num_params,
        ),
        workload=WorkloadInfo(
            # A file workload is stored by path so `check` can load it again.
            name=workload.source if not workload.source.startswith("builtin:") else workload.name,
            prompts=len(case.prompts),
            sha256=workload.sha256,
            max_new_tokens=max(case.max_new_tokens),
            temperature=case.temperature,
        ),
        costs=costs,
        search=SearchInfo(
            sampler=settings.sampler,
            trials=result.trials,
            failed=result.failed,
            pruned=result.pruned,
            study_name=result.study_name,
            storage=storage_for_record(result.storage),
            seed=settings.seed,
            space=result.space,
            finalists=result.finalists,
            final_repeats=settings.final_repeats if result.finalists else 0,
            engine=settings.engine,
        ),
        best=result.results[0],
        # The baseline has its own section; as an alternative it would only take a config's place.
        alternatives=[r for r in result.results[1:] if r.config.gamma > 0][:4],
        baseline=result.baseline,
        versions=versions,
        created=datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat(),
    )
