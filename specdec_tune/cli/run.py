"""`specdec-tune run`: profile, search at each batch size, write the profile (options and rendering)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .. import app as api
from ..app.categories import check_categories
from ..app.categories import per_category as measure_categories
from ..app.workers import tune_workers
from ..backends.base import default_max_gamma
from ..errors import SpecDecError
from ..limits import parse_batch_sizes, parse_context_lengths
from ..output.categories import category_table
from ..output.reports import run_summary
from ..store.yamlio import profile_to_dict
from .options import (
    BackendOpt,
    Device,
    Drafts,
    Dtype,
    EngineOpt,
    JsonOut,
    LlamaServer,
    MaxNew,
    Prompts,
    StorageUrl,
    Target,
    Temperature,
    Threads,
    WorkloadOpt,
    models_from,
)
from .terminal import CliProgress, console, print_json, quiet_libraries, user_errors

LayerSkipOpt = Annotated[
    list[int] | None,
    typer.Option("--layer-skip", help="Repeatable: also search layer-skip with K layers."),
]
TrialsOpt = Annotated[
    int | None,
    typer.Option(
        help="Finished trials the study should hold (default: 20 for tpe, the grid's size for grid)."
    ),
]
TimeoutOpt = Annotated[float | None, typer.Option(help="Stop starting trials after this many seconds.")]
SamplerOpt = Annotated[str, typer.Option(help="tpe (seeded by the cost model) or grid (exhaustive).")]
MaxGammaOpt = Annotated[
    int | None,
    typer.Option(
        "--max-gamma",
        help="Largest γ searched (and profiled); default: the backend's (8 in our engine, 16 in "
        "llamacpp, whose n-gram drafts cost next to nothing per drafted token).",
    ),
]
RepeatsOpt = Annotated[int, typer.Option(help="Timed repeats per trial (baseline interleaved).")]
ScreenPromptsOpt = Annotated[
    int | None,
    typer.Option(
        "--screen-prompts",
        help="Prompts a trial measures first; a config clearly losing on them stops there "
        "(default: a third of the workload's; 0: off; llama.cpp only).",
    ),
]
FinalistsOpt = Annotated[
    int,
    typer.Option(help="After the search, re-measure this many top configs head to head (0: off)."),
]
FinalRepeatsOpt = Annotated[
    int | None,
    typer.Option(
        "--final-repeats",
        help="A hard cap: no finalist gets more than N interleaved repeats in that final round (a "
        "first pass of min(N, 5), racing rounds up to N; neither racing nor a noisy machine goes "
        "past it). Default: a first pass of 5, racing up to 16 (more on a noisy machine) until the "
        "winner is resolved or the budget ends.",
    ),
]
StudyNameOpt = Annotated[
    str | None, typer.Option(help="Default: derived from version, target, workload and space.")
]
CostsFileOpt = Annotated[
    Path | None,
    typer.Option("--costs", help="Reuse costs from `specdec-tune profile --out` instead of profiling."),
]
NoProfileOpt = Annotated[bool, typer.Option("--no-profile", help="Skip the cost model (no seeding).")]
OutOpt = Annotated[Path | None, typer.Option("--out", help="Default: profiles/<hardware>/<target>.yaml")]
ForceOpt = Annotated[
    bool,
    typer.Option("--force", help="Replace the output file even when it holds the profile of another target."),
]
BatchSizesOpt = Annotated[
    str,
    typer.Option(
        "--batch-sizes",
        help="Comma-separated batch sizes (requests in flight) to tune for, e.g. 1,4,16; the profile "
        "gets the best config per batch size and B*.",
    ),
]
ContextLengthsOpt = Annotated[
    str | None,
    typer.Option(
        "--context-lengths",
        help="Comma-separated prompt lengths in the target's tokens, e.g. 256,2048,6144: every prompt is "
        "fitted to each length with real text before its request, and the profile gets the best config "
        "per (batch size, length), T_target(L) and L*, where speculation stops paying.",
    ),
]
BudgetOpt = Annotated[
    float,
    typer.Option(
        help="Wall-clock budget in seconds for the whole run when --trials is not given: the trial "
        "count is sized from this machine's speed (0: no budget, 20 trials).",
    ),
]
WorkersOpt = Annotated[
    int,
    typer.Option(
        help="Local worker processes on this study, each pinned to its share of the cores "
        "(helps only a target that leaves cores idle: I/O or GPU bound)."
    ),
]
ReferenceProcessesOpt = Annotated[
    int,
    typer.Option(
        help="After the run, measure the best config as `check` does in this many fresh processes; "
        "check judges tokens/s against them (0: against the final round's).",
        envvar="SPECDEC_REFERENCE_PROCESSES",
    ),
]
HeartbeatOpt = Annotated[int, typer.Option(hidden=True, envvar="SPECDEC_HEARTBEAT_S")]
GraceOpt = Annotated[int, typer.Option(hidden=True, envvar="SPECDEC_GRACE_S")]
ServingEngineOpt = Annotated[
    str | None,
    typer.Option(
        "--for",
        help="hf, vllm, llamacpp or sglang: search only configs that engine can run, with its policies.",
    ),
]
GammaPoliciesOpt = Annotated[
    str,
    typer.Option(
        "--gamma-policies",
        help="Comma-separated per-step γ policies to search: fixed, heuristic (transformers' +2/−1), "
        "costmodel (γ from the running acceptance and the measured costs); γ is their maximum.",
    ),
]
PerCategoryOpt = Annotated[
    bool,
    typer.Option(
        "--per-category",
        help="After the search, measure the top configs on each category's prompts and add the "
        "per-category table to the profile (needs a workload with categories, e.g. general).",
    ),
]


def run(
    target: Target = None,
    draft: Drafts = None,
    layer_skip: LayerSkipOpt = None,
    trials: TrialsOpt = None,
    timeout: TimeoutOpt = None,
    sampler: SamplerOpt = "tpe",
    max_gamma: MaxGammaOpt = None,
    temperature: Temperature = 0.0,
    max_new_tokens: MaxNew = 48,
    workload: WorkloadOpt = "demo-code",
    prompts: Prompts = 8,
    repeats: RepeatsOpt = 2,
    screen_prompts: ScreenPromptsOpt = None,
    finalists: FinalistsOpt = 3,
    final_repeats: FinalRepeatsOpt = None,
    seed: int = 0,
    storage: StorageUrl = None,
    study_name: StudyNameOpt = None,
    costs_file: CostsFileOpt = None,
    no_profile: NoProfileOpt = False,
    out: OutOpt = None,
    force: ForceOpt = False,
    batch_sizes: BatchSizesOpt = "1",
    context_lengths: ContextLengthsOpt = None,
    budget: BudgetOpt = 240.0,
    workers: WorkersOpt = 1,
    reference_processes: ReferenceProcessesOpt = 3,
    heartbeat: HeartbeatOpt = 5,
    grace: GraceOpt = 20,
    serving_engine: ServingEngineOpt = None,
    gamma_policies: GammaPoliciesOpt = "fixed",
    per_category: PerCategoryOpt = False,
    device: Device = "auto",
    dtype: Dtype = "auto",
    engine_mode: EngineOpt = "auto",
    backend: BackendOpt = "native",
    llama_server: LlamaServer = None,
    threads: Threads = None,
    json_out: JsonOut = False,
) -> None:
    """Profile, search (Optuna over the real speculative loop) and write the winning YAML profile."""
    with user_errors():
        quiet_libraries()

        sizes = parse_batch_sizes(batch_sizes)
        lengths = parse_context_lengths(context_lengths) if context_lengths is not None else None
        if budget < 0:
            raise SpecDecError(f"--budget must be >= 0 seconds, got {budget}")
        settings = api.TuneSettings(
            trials=trials,
            timeout_s=timeout,
            sampler=sampler,
            seed=seed,
            max_gamma=max_gamma or default_max_gamma(backend),
            repeats=repeats,
            screen_prompts=screen_prompts,
            finalists=finalists,
            final_repeats_cap=final_repeats,
            storage=storage,
            study_name=study_name,
            heartbeat_s=heartbeat,
            grace_s=grace,
            serving_engine=serving_engine,
            gamma_policies=tuple(p.strip() for p in gamma_policies.split(",") if p.strip()),
            force=force,
            reference_processes=reference_processes,
        )
        models = models_from(
            target, draft, workload, max_new_tokens, temperature, prompts, device, dtype,
            engine_mode=engine_mode, backend=backend, llama_server=llama_server, threads=threads,
        )  # fmt: skip
        inputs = api.SearchInputs(layer_skip, costs_file, no_profile)
        envelope = api.Envelope(sizes, lengths)
        limits = api.RunLimits(budget or None, workers)
        _run(models, settings, limits, inputs, envelope, out, per_category, json_out)


def _run(
    models: api.Models,
    settings: api.TuneSettings,
    limits: api.RunLimits,
    inputs: api.SearchInputs,
    envelope: api.Envelope,
    out: Path | None,
    per_category: bool,
    json_out: bool,
) -> None:
    """Tune (on `limits.workers` processes), add the per-category table when asked, and render."""
    if envelope.context_lengths and per_category:
        raise SpecDecError("--per-category measures the workload as written: drop --context-lengths")
    if per_category:
        check_categories(models)
    with CliProgress(json_out, "loading", 1.0) as progress:
        o = tune_workers(models, settings, limits, inputs, out, progress, envelope)
        if per_category:
            o.profile = measure_categories(
                models, o.path, repeats=max(2, settings.repeats), seed=settings.seed, progress=progress
            )
    if json_out:
        print_json({"profile": str(o.path), "trials_csv": str(o.trials_csv), **profile_to_dict(o.profile)})
        return

    run_summary(console(), o.profile, o.result)

    table = category_table(o.profile)
    if table is not None:
        console().print(table)
    console().print(f"wrote {o.path} and {o.trials_csv}")
