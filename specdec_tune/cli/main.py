"""The `specdec-tune` typer app: parse, call one `app` use case, render with rich (`terminal`).

Heavy imports (torch, transformers, optuna) happen inside the commands so `--help` is instant.
A user mistake (SpecDecError) is one red line and exit code 2; other hardware is exit code 3;
an unexpected failure (a bug, out of memory) is one line and exit code 4.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .. import __version__
from .. import app as api
from ..backends.acceptance import parse_given
from ..checkpolicy import CHECK_POLICY
from ..errors import SpecDecError
from ..output.benchmark_action import benchmark_action_entries
from ..output.categories import bench_categories_table, per_source_table
from ..output.reports import bench_table, check_plan_text, check_table, costs_report
from ..output.verdicts import CheckReport
from ..store.yamlio import profile_to_dict
from .gguf import gguf_app
from .options import (
    AcceptanceFrom,
    AcceptanceVectors,
    BackendOpt,
    ContextLen,
    Device,
    Drafts,
    Dtype,
    EngineOpt,
    JsonOut,
    LlamaServer,
    MaxNew,
    Prompts,
    Shape,
    Target,
    Temperature,
    Threads,
    WorkloadOpt,
    models_from,
)
from .profiles import export, show
from .reference import reference
from .run import run
from .studies import studies_app
from .terminal import CliProgress, console, error_line, print_json, quiet_libraries, spinner, user_errors

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Hardware-aware autotuner for speculative decoding. With no model arguments every command "
    "uses the shipped demo pair (offline, CPU).",
)
app.add_typer(studies_app, name="studies")
app.add_typer(gguf_app, name="gguf")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"specdec-tune {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
    threads: Annotated[
        int | None,
        typer.Option(
            help="torch CPU threads (default: torch's choice). Part of a CPU profile's hardware slug.",
            envvar="SPECDEC_THREADS",
        ),
    ] = None,
) -> None:
    if threads is not None:
        if threads < 1:
            error_line("error", f"--threads must be >= 1, got {threads}")
            raise typer.Exit(2)
        import torch

        torch.set_num_threads(threads)


@app.command()
def bench(
    target: Target = None,
    draft: Annotated[
        str,
        typer.Option(
            "--draft",
            "-d",
            help="A draft model (folder/HF id/demo name), prompt-lookup[:MIN-MAX] or layer-skip:K.",
        ),
    ] = "draft-1l",
    gamma: Annotated[int, typer.Option("--gamma", "-g", help="Draft tokens per step (1..64).")] = 4,
    threshold: Annotated[float, typer.Option(help="Draft confidence early stop, [0, 1); 0 = off.")] = 0.0,
    temperature: Temperature = 0.0,
    max_new_tokens: MaxNew = 64,
    workload: WorkloadOpt = "demo-code",
    prompt: Annotated[str | None, typer.Option(help="A single prompt instead of a workload.")] = None,
    prompts: Prompts = None,
    repeats: Annotated[
        int, typer.Option(help="Timed repeats of each side (median and spread reported).")
    ] = 3,
    seed: int = 0,
    compare_hf: Annotated[
        bool,
        typer.Option(
            "--compare-hf", help="Also time transformers' assisted generation with the same settings."
        ),
    ] = False,
    save_outputs: Annotated[
        Path | None, typer.Option(help="Write JSONL with prompt, generated ids and text per prompt.")
    ] = None,
    batch_size: Annotated[
        int | None,
        typer.Option(
            "--batch-size",
            "-b",
            help="Requests in flight (closed loop: a finished one is replaced by the next prompt); "
            "both sides use the batched engine. Default: one request at a time.",
        ),
    ] = None,
    per_category: Annotated[
        bool,
        typer.Option(
            "--per-category/--no-per-category",
            help="On a workload with categories (e.g. general), also measure each category (batch 1).",
        ),
    ] = True,
    device: Device = "auto",
    dtype: Dtype = "auto",
    engine_mode: EngineOpt = "auto",
    backend: BackendOpt = "native",
    llama_server: LlamaServer = None,
    threads: Threads = None,
    json_out: JsonOut = False,
) -> None:
    """Measure one config against the plain target, timed in the same run."""
    with user_errors():
        quiet_libraries()

        models = models_from(
            target,
            None,
            workload,
            max_new_tokens,
            temperature,
            prompts,
            device,
            dtype,
            prompt,
            engine_mode,
            backend,
            llama_server,
            threads,
        )
        with spinner("measuring…", json_out):
            result = api.bench(
                models,
                draft,
                gamma,
                threshold,
                repeats,
                seed,
                compare_hf,
                save_outputs,
                batch_size,
                per_category,
            )
        if json_out:
            print_json(result.as_dict())
            return

        console().print(bench_table(result.as_dict()))
        for extra in (
            per_source_table(result.measurement.metrics),
            bench_categories_table(result.categories or []),
        ):
            if extra is not None:
                console().print(extra)


@app.command("profile")
def profile_cmd(
    target: Target = None,
    draft: Drafts = None,
    max_gamma: Annotated[int, typer.Option("--max-gamma", help="Γ: measure C_ver(γ) for γ = 1..Γ.")] = 16,
    repeats: Annotated[int, typer.Option(help="Timed repeats per measurement.")] = 7,
    workload: WorkloadOpt = "demo-code",
    max_new_tokens: MaxNew = 64,
    prompts: Prompts = None,
    out: Annotated[Path | None, typer.Option("--out", help="Write the measured costs as YAML.")] = None,
    shape: Shape = None,
    context_len: ContextLen = None,
    acceptance_vector: AcceptanceVectors = None,
    acceptance_from: AcceptanceFrom = None,
    device: Device = "auto",
    dtype: Dtype = "auto",
    engine_mode: EngineOpt = "auto",
    backend: BackendOpt = "native",
    llama_server: LlamaServer = None,
    threads: Threads = None,
    json_out: JsonOut = False,
) -> None:
    """Measure hardware costs (T_target, C_ver(γ), T_draft, bandwidth) and predict the best configs.
    With --shape (random weights) the costs of a model size before its weights are here."""
    with user_errors():
        quiet_libraries()

        if shape is not None:
            if target is not None:
                raise SpecDecError(
                    "give --shape NAME or --target, not both (--shape NAME is --target shape:NAME)"
                )
            target = shape if shape.startswith("shape:") else f"shape:{shape}"
        given = parse_given(acceptance_vector, acceptance_from)
        models = models_from(
            target,
            draft,
            workload,
            max_new_tokens,
            0.0,
            prompts,
            device,
            dtype,
            engine_mode=engine_mode,
            backend=backend,
            llama_server=llama_server,
            threads=threads,
        )
        if backend != "native" and (shape or not given.empty):
            raise SpecDecError("--shape and given acceptance profile our own engine: drop --backend")
        with CliProgress(json_out, "profiling", 1.0) as progress:
            r = api.profile_costs(models, max_gamma, repeats, out, progress, context_len, given)
        if json_out:
            print_json(
                {
                    "hardware": r.hardware,
                    "target": r.target,
                    "costs": profile_to_dict(r.costs),
                    "best_gamma": {
                        k: {"gamma": g, "predicted_speedup": v} for k, (g, v) in r.best_gamma.items()
                    },
                    "predicted": [
                        {"draft": n, "gamma": g, "predicted_speedup": v} for n, g, v in r.ranked[:10]
                    ],
                }
            )
            return

        costs_report(console(), r.hardware, r.costs, r.best_gamma, r.ranked[:8], r.target)
        if out is not None:
            console().print(f"wrote {out}")


@app.command()
def check(
    profile: Annotated[Path, typer.Argument(help="A profile YAML written by `specdec-tune run`.")],
    tolerance: Annotated[
        float, typer.Option(help="Allowed relative drop of the speedup.")
    ] = CHECK_POLICY.tolerance,
    acceptance_tolerance: Annotated[
        float | None,
        typer.Option(
            help=f"Allowed absolute change of α (default {CHECK_POLICY.greedy_acceptance_tolerance} greedy, "
            f"{CHECK_POLICY.sampled_acceptance_tolerance} sampling)."
        ),
    ] = None,
    repeats: Annotated[int, typer.Option(help="Timed repeats (median compared).")] = 3,
    allow_other_hardware: Annotated[
        bool, typer.Option("--allow-other-hardware", help="Compare even on different hardware.")
    ] = False,
    junit: Annotated[Path | None, typer.Option(help="Also write the result as JUnit XML.")] = None,
    batch_size: Annotated[
        int | None,
        typer.Option(
            "--batch-size",
            "-b",
            help="Re-measure only this batch table row (default: the best config and every row).",
        ),
    ] = None,
    output_format: Annotated[
        str,
        typer.Option(
            "--format",
            help="table, json, or benchmark-action (github-action-benchmark's customBiggerIsBetter JSON).",
        ),
    ] = "table",
    models_root: Annotated[
        Path | None,
        typer.Option(
            "--models-root",
            envvar="SPECDEC_MODELS_ROOT",
            help="Load only model folders, shapes and workload files inside this folder (plus demo "
            "models, bundled workloads and cached HF ids): for profiles from untrusted pull requests.",
        ),
    ] = None,
    device: Device = "auto",
    backend: Annotated[
        str | None,
        typer.Option(
            "--backend",
            help="native or llamacpp: re-measure in that engine (default: the one the profile names).",
        ),
    ] = None,
    llama_server: LlamaServer = None,
    allow_other_build: Annotated[
        bool,
        typer.Option("--allow-other-build", help="Compare even with another llama.cpp build (else exit 3)."),
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Measure nothing: validate the profile, find what it names here (target, drafts, "
            "workload) and list what `check` would re-measure.",
        ),
    ] = False,
    json_out: JsonOut = False,
) -> None:
    """Re-measure a stored profile here. Exit 0 pass, 1 regression, 2 bad input, 3 other hardware
    or engine build, 6 inconclusive (too noisy to tell)."""
    with user_errors():
        quiet_libraries()
        if dry_run:
            plan = api.plan_check(profile, batch_size)
            if json_out:
                print_json(plan.as_dict())
            else:
                console().print(check_plan_text(plan), markup=False, highlight=False)
            return

        if output_format not in ("table", "json", "benchmark-action"):
            raise SpecDecError(f"unknown --format '{output_format}': use table, json or benchmark-action")
        json_out = json_out or output_format == "json"
        machine = json_out or output_format == "benchmark-action"
        with spinner("re-measuring…", machine):
            report = api.check(
                profile,
                device,
                tolerance,
                acceptance_tolerance,
                repeats,
                allow_other_hardware=allow_other_hardware,
                junit=junit,
                batch_size=batch_size,
                models_root=models_root,
                backend=backend,
                server=llama_server,
                allow_other_build=allow_other_build,
            )
        _render_check(report, output_format, json_out)


def _render_check(report: CheckReport, output_format: str, json_out: bool) -> None:
    """The report in the asked format; exit 1 on a regression, 6 when too noisy to tell."""
    if output_format == "benchmark-action":
        print_json(benchmark_action_entries(report))
    elif json_out:
        print_json(report.as_dict())
    else:
        console().print(check_table(report))
    if not report.passed:
        bad = ", ".join(
            f"{i.metric} (stored {i.stored}, measured {i.measured})" for i in report.items if not i.ok
        )
        error_line("regression", bad)
        raise typer.Exit(1)
    if report.inconclusive:
        error_line("inconclusive", report.inconclusive_line, style="yellow")
        raise typer.Exit(6)  # documented in docs/cli.md: inconclusive, the machine was too noisy


app.command()(export)
app.command()(show)
app.command()(run)
app.command()(reference)


def main() -> None:
    app()
