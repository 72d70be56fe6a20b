"""The `specdec-tune` command line: parse, call the library, render with rich. No logic lives here.

Heavy imports (torch, transformers, optuna) happen inside the commands so `--help` is instant.
A user mistake (SpecDecError) is one red line and exit code 2; other hardware is exit code 3;
an unexpected failure (a bug, out of memory) is one line and exit code 4.
"""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from . import __version__
from .errors import OtherHardwareError, SpecDecError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Hardware-aware autotuner for speculative decoding. With no model arguments every command "
    "uses the shipped demo pair (offline, CPU).",
)

# Options shared by the commands that load models.
Target = Annotated[
    str | None,
    typer.Option(
        "--target", "-t", help="Target model: folder or HF id in the local cache. Default: demo target."
    ),
]
Device = Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.", envvar="SPECDEC_DEVICE")]
Dtype = Annotated[str, typer.Option(help="auto (fp32 on CPU, bf16 on CUDA), float32, bfloat16, float16.")]
WorkloadOpt = Annotated[
    str, typer.Option("--workload", "-w", help="Built-in name (demo-code, general) or a JSONL path.")
]
MaxNew = Annotated[int, typer.Option("--max-new-tokens", "-n", help="Tokens to generate per prompt.")]
Temperature = Annotated[float, typer.Option(help="0 = greedy (exact match with the target).")]
Prompts = Annotated[
    int | None, typer.Option("--prompts", help="Use only the first N prompts of the workload.")
]
JsonOut = Annotated[bool, typer.Option("--json", help="Print a machine-readable result on stdout.")]


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
            _err_console().print(f"[red]error:[/red] --threads must be >= 1, got {threads}")
            raise typer.Exit(2)
        import torch

        torch.set_num_threads(threads)


def _err_console() -> Any:
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def _console() -> Any:
    from rich.console import Console

    return Console(highlight=False)


@contextmanager
def user_errors():
    """Turn project errors into one red line and an exit code; never a traceback for those."""
    try:
        yield
    except OtherHardwareError as exc:
        _err_console().print(f"[red]error:[/red] {exc}", soft_wrap=True)
        raise typer.Exit(3) from None
    except SpecDecError as exc:
        _err_console().print(f"[red]error:[/red] {exc}", soft_wrap=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        _err_console().print("[red]interrupted[/red]")
        raise typer.Exit(130) from None
    except (typer.Exit, typer.Abort):
        raise
    except Exception as exc:
        # Not a user mistake: a bug or the machine (e.g. out of memory). Exit 4 keeps it apart from
        # check's 1 (regression); SPECDEC_DEBUG=1 shows the traceback.
        import os

        if os.environ.get("SPECDEC_DEBUG"):
            raise
        _err_console().print(
            f"[red]internal error:[/red] {type(exc).__name__}: {exc} (SPECDEC_DEBUG=1 shows the traceback)",
            soft_wrap=True,
        )
        raise typer.Exit(4) from None


@contextmanager
def _spinner(text: str, quiet: bool):
    """A status line on stderr while measuring (none with --json, so stdout stays clean)."""
    if quiet:
        yield
        return
    with _err_console().status(text):
        yield


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


def _quiet_libraries() -> None:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("optuna").setLevel(logging.WARNING)


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
    device: Device = "auto",
    dtype: Dtype = "auto",
    json_out: JsonOut = False,
) -> None:
    """Measure one config against the plain target, timed in the same run."""
    with user_errors():
        _quiet_libraries()
        from .drafters import build_drafter
        from .engine import validate_args
        from .measure import measure
        from .session import open_session

        validate_args(gamma, threshold, temperature, max_new_tokens)
        if gamma < 1:
            raise SpecDecError(
                "gamma must be an integer in 1..64 for bench (the baseline is always measured)"
            )
        s = open_session(
            target, [draft], workload, max_new_tokens, temperature, device, dtype, prompts, prompt
        )
        spec = s.specs[0]
        drafter = build_drafter(spec, s.target.model, s.draft_modules)
        with _spinner("measuring…", json_out):
            m = measure(s.target.model, drafter, gamma, threshold, s.case, repeats=repeats, seed=seed)
            hf = None
            if compare_hf:
                from .hfcompare import measure_hf

                dm = s.drafts[spec.name].model if spec.kind == "model" else None
                hf = measure_hf(
                    s.target.model,
                    s.case,
                    spec.kind,
                    gamma,
                    threshold,
                    draft_model=dm,
                    ngram_max=spec.ngram_max or 3,
                    layers=spec.layers,
                    repeats=repeats,
                )
        if save_outputs is not None:
            from .profile import atomic_write_text

            tok = s.target.tokenizer
            lines = [
                json.dumps({"prompt": p.text, "token_ids": ids, "text": tok.decode(ids)})
                for p, ids in zip(s.workload.prompts, m.outputs, strict=True)
            ]
            atomic_write_text(save_outputs, "\n".join(lines) + "\n")
        result = {
            "target": s.target.name,
            "draft": spec.name,
            "gamma": gamma,
            "threshold": threshold,
            "temperature": temperature,
            "workload": s.workload.name,
            "prompts": len(s.case.prompts),
            "device": s.device,
            **m.as_dict(),
        }
        if hf is not None:
            result["hf"] = hf
        if json_out:
            _print_json(result)
            return
        from .report import bench_table

        _console().print(bench_table(result))


Drafts = Annotated[
    list[str] | None,
    typer.Option(
        "--draft",
        "-d",
        help="Repeatable. A draft model (folder/HF id/demo name), prompt-lookup[:MIN-MAX] or layer-skip:K. "
        "Default: the demo drafts + prompt-lookup (demo target), prompt-lookup otherwise.",
    ),
]


def _check_writable(path: Path) -> None:
    """Fail before minutes of measuring, not after, when the output cannot be written."""
    import os

    folder = path.parent if str(path.parent) else Path(".")
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if path.is_dir() or not os.access(probe, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise SpecDecError(f"cannot write {path}: choose a writable file path")


def _progress(json_out: bool) -> Any:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        console=_err_console(),
        disable=json_out,
        transient=True,
    )


def _profile_costs(s: Any, pool: Any, max_gamma: int, repeats: int, json_out: bool) -> Any:
    from .measure import Case
    from .profiler import profile_costs

    drafters = {}
    err = _err_console()
    for spec in s.specs:
        try:
            drafters[spec.name] = pool.get(spec.name)
        except Exception as exc:
            err.print(
                f"[yellow]warning:[/yellow] draft '{spec.name}' is unusable, skipped: {exc}", soft_wrap=True
            )
    # Costs and acceptance need fewer tokens than the search: a subset keeps `profile` quick.
    n = min(len(s.case.prompts), 8)
    case = Case(s.case.prompts[:n], s.case.max_new_tokens[:n], s.case.eos, 0.0)
    with _progress(json_out) as progress:
        task = progress.add_task("profiling", total=1.0, info="")
        costs = profile_costs(
            s.target.model,
            drafters,
            case,
            s.device,
            max_gamma=max_gamma,
            repeats=repeats,
            progress=lambda label, frac: progress.update(task, completed=frac, info=label),
        )
    return costs


def _pool(s: Any, specs: list[Any]) -> Any:
    from .models import check_vocab_compatible, load_model
    from .tuner import DrafterPool

    def load(spec: Any) -> Any:
        if spec.name in s.drafts:
            return s.drafts[spec.name].model
        d = load_model(spec.path or spec.name, s.device, s.target.dtype)
        check_vocab_compatible(s.target, d)
        s.drafts[spec.name] = d
        return d.model

    return DrafterPool(specs, s.target.model, load)


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
    device: Device = "auto",
    dtype: Dtype = "auto",
    json_out: JsonOut = False,
) -> None:
    """Measure hardware costs (T_target, C_ver(γ), T_draft, bandwidth) and predict the best configs."""
    with user_errors():
        _quiet_libraries()
        if not 1 <= max_gamma <= 64:
            raise SpecDecError(f"--max-gamma must be in 1..64, got {max_gamma}")
        if out is not None:
            _check_writable(out)
        from .costmodel import best_gamma, overheads, rank_configs
        from .hardware import hardware_info
        from .profile import atomic_write_text, costs_to_yaml, profile_to_dict
        from .session import open_session

        s = open_session(
            target, draft, workload, max_new_tokens, 0.0, device, dtype, prompts, lazy_drafts=True
        )
        hw = hardware_info(s.device)
        costs = _profile_costs(s, _pool(s, s.specs), max_gamma, repeats, json_out)
        drafts = {d.name: (d.t_draft_ms, d.acceptance_vector) for d in costs.drafts}
        extra = overheads(costs)
        ranked = (
            rank_configs(costs.t_target_ms, costs.verify_ms, drafts, max_gamma, **extra) if drafts else []
        )
        per_draft = {
            d.name: best_gamma(
                costs.t_target_ms, d.t_draft_ms, costs.verify_ms, d.acceptance_vector, max_gamma, **extra
            )
            for d in costs.drafts
        }
        if out is not None:
            atomic_write_text(out, costs_to_yaml(costs, hw))
        if json_out:
            _print_json(
                {
                    "hardware": hw,
                    "costs": profile_to_dict(costs),
                    "best_gamma": {
                        k: {"gamma": g, "predicted_speedup": v} for k, (g, v) in per_draft.items()
                    },
                    "predicted": [
                        {"draft": n, "gamma": g, "predicted_speedup": v} for n, g, v in ranked[:10]
                    ],
                }
            )
            return
        from .report import costs_report

        costs_report(_console(), hw, costs, per_draft, ranked[:8])
        if out is not None:
            _console().print(f"wrote {out}")


@app.command()
def run(
    target: Target = None,
    draft: Drafts = None,
    layer_skip: Annotated[
        list[int] | None,
        typer.Option("--layer-skip", help="Repeatable: also search layer-skip with K layers."),
    ] = None,
    trials: Annotated[
        int | None,
        typer.Option(
            help="Finished trials the study should hold (default: 20 for tpe, the grid's size for grid)."
        ),
    ] = None,
    timeout: Annotated[
        float | None, typer.Option(help="Stop starting trials after this many seconds.")
    ] = None,
    sampler: Annotated[
        str, typer.Option(help="tpe (seeded by the cost model) or grid (exhaustive).")
    ] = "tpe",
    max_gamma: Annotated[int, typer.Option("--max-gamma", help="Largest γ searched (and profiled).")] = 8,
    temperature: Temperature = 0.0,
    max_new_tokens: MaxNew = 48,
    workload: WorkloadOpt = "demo-code",
    prompts: Prompts = 8,
    repeats: Annotated[int, typer.Option(help="Timed repeats per trial (baseline interleaved).")] = 2,
    finalists: Annotated[
        int,
        typer.Option(help="After the search, re-measure this many top configs head to head (0: off)."),
    ] = 3,
    final_repeats: Annotated[
        int, typer.Option("--final-repeats", help="Interleaved repeats of that final round.")
    ] = 4,
    seed: int = 0,
    storage: Annotated[
        str | None,
        typer.Option(
            help="Optuna storage URL (default: SQLite in ~/.cache/specdec-tune).", envvar="SPECDEC_STORAGE"
        ),
    ] = None,
    study_name: Annotated[
        str | None, typer.Option(help="Default: derived from target, workload and space.")
    ] = None,
    costs_file: Annotated[
        Path | None,
        typer.Option("--costs", help="Reuse costs from `specdec-tune profile --out` instead of profiling."),
    ] = None,
    no_profile: Annotated[
        bool, typer.Option("--no-profile", help="Skip the cost model (no seeding).")
    ] = False,
    out: Annotated[
        Path | None, typer.Option("--out", help="Default: profiles/<hardware>/<target>.yaml")
    ] = None,
    device: Device = "auto",
    dtype: Dtype = "auto",
    json_out: JsonOut = False,
) -> None:
    """Profile, search (Optuna over the real speculative loop) and write the winning YAML profile."""
    with user_errors():
        _quiet_libraries()
        from .hardware import hardware_info, hardware_slug, same_hardware, slugify
        from .models import content_hash
        from .profile import DraftSpec, atomic_write_text, load_costs, profile_to_dict, save_profile
        from .session import open_session
        from .tuner import TuneSettings, make_profile, tune

        settings = TuneSettings(
            trials=trials or 20,
            timeout_s=timeout,
            sampler=sampler,
            seed=seed,
            max_gamma=max_gamma,
            repeats=repeats,
            finalists=finalists,
            final_repeats=final_repeats,
            storage=storage,
            study_name=study_name,
        )
        if out is not None:
            _check_writable(out)
        s = open_session(
            target, draft, workload, max_new_tokens, temperature, device, dtype, prompts, lazy_drafts=True
        )
        specs = list(s.specs) + [
            DraftSpec(name=f"layer-skip-{k}", kind="layer_skip", layers=k) for k in layer_skip or []
        ]
        hw = hardware_info(s.device)
        slug = hardware_slug(hw)
        hw["slug"] = slug
        out = out or Path("profiles") / slug / f"{slugify(s.target.name)}.yaml"
        _check_writable(out)
        pool = _pool(s, specs)
        if trials is None and sampler == "grid":
            from .tuner import grid_size

            settings.trials = grid_size(specs, settings)
        costs = None
        if costs_file is not None:
            costs, costs_hw = load_costs(costs_file)
            if not same_hardware(costs_hw, hw):
                raise SpecDecError(f"{costs_file} was measured on {costs_hw.get('slug')}, this is {slug}")
        elif not no_profile:
            costs = _profile_costs(s, pool, max_gamma, 5, json_out)
        key = {
            "hardware": slug,
            "target_slug": slugify(s.target.name),
            "target": content_hash(s.target.path),
            "workload": s.workload.sha256,
            "prompts": len(s.case.prompts),
            "max_new_tokens": s.case.max_new_tokens,
            "temperature": temperature,
            "dtype": s.target.dtype,
            "repeats": repeats,
        }
        with _progress(json_out) as progress:
            task = progress.add_task("searching", total=settings.trials, info="")

            def on_trial(done: int, total: int, best: float | None) -> None:
                progress.update(task, completed=done, info=f"best {best:.3f}×" if best else "")

            def on_final(labels: list[str]) -> None:
                progress.update(task, description="final round", info=f"re-measuring {', '.join(labels)}")

            result = tune(s.target.model, specs, s.case, settings, costs, pool, key, on_trial, on_final)
        prof = make_profile(result, settings, hw, s.target, s.workload, s.case, costs)
        save_profile(prof, out)
        csv_path = out.with_suffix(".trials.csv")
        import pandas as pd

        atomic_write_text(csv_path, pd.DataFrame(result.rows).to_csv(index=False))
        if json_out:
            _print_json({"profile": str(out), "trials_csv": str(csv_path), **profile_to_dict(prof)})
            return
        from .report import run_summary

        run_summary(_console(), prof, result)
        _console().print(f"wrote {out} and {csv_path}")


@app.command()
def check(
    profile: Annotated[Path, typer.Argument(help="A profile YAML written by `specdec-tune run`.")],
    tolerance: Annotated[float, typer.Option(help="Allowed relative drop of the speedup.")] = 0.10,
    acceptance_tolerance: Annotated[
        float | None, typer.Option(help="Allowed absolute change of α (default 0.02 greedy, 0.08 sampling).")
    ] = None,
    repeats: Annotated[int, typer.Option(help="Timed repeats (median compared).")] = 3,
    allow_other_hardware: Annotated[
        bool, typer.Option("--allow-other-hardware", help="Compare even on different hardware.")
    ] = False,
    junit: Annotated[Path | None, typer.Option(help="Also write the result as JUnit XML.")] = None,
    device: Device = "auto",
    json_out: JsonOut = False,
) -> None:
    """Re-measure a stored profile here. Exit 0 pass, 1 regression, 2 bad input, 3 other hardware."""
    with user_errors():
        _quiet_libraries()
        from .check import check_profile, junit_xml
        from .profile import atomic_write_text, load_profile

        p = load_profile(profile)
        if junit is not None:
            _check_writable(junit)
        with _spinner("re-measuring…", json_out):
            report = check_profile(
                p, str(profile), device, tolerance, acceptance_tolerance, repeats, allow_other_hardware
            )
        if junit is not None:
            atomic_write_text(junit, junit_xml(report))
        if json_out:
            _print_json(report.as_dict())
        else:
            from rich.table import Table

            t = Table(title=f"check {profile}: {report.config}")
            for col in ("metric", "stored", "measured", "result", "note"):
                t.add_column(col)
            for i in report.items:
                t.add_row(
                    i.metric,
                    str(i.stored),
                    str(i.measured),
                    "[green]ok[/green]" if i.ok else "[red]REGRESSION[/red]",
                    i.note,
                )
            _console().print(t)
        if not report.passed:
            bad = ", ".join(
                f"{i.metric} (stored {i.stored}, measured {i.measured})" for i in report.items if not i.ok
            )
            _err_console().print(f"[red]regression:[/red] {bad}", soft_wrap=True)
            raise typer.Exit(1)


@app.command()
def export(
    profile: Annotated[Path, typer.Argument(help="A profile YAML written by `specdec-tune run`.")],
    to: Annotated[str, typer.Option("--to", help="hf, vllm, llamacpp or sglang.")] = "hf",
    json_out: JsonOut = False,
) -> None:
    """Print a profile's best config as a serving engine's settings (gaps are said on stderr)."""
    with user_errors():
        from .export import export_profile, export_settings
        from .profile import load_profile

        p = load_profile(profile)
        if json_out:
            settings, warnings = export_settings(p, to)
            _print_json({"engine": to, "settings": settings, "warnings": warnings})
        else:
            text, warnings = export_profile(p, to)
            if text:
                typer.echo(text.rstrip("\n"))
        err = _err_console()
        for w in warnings:
            err.print(f"[yellow]note:[/yellow] {w}", soft_wrap=True)


@app.command()
def show(
    profile: Annotated[Path, typer.Argument(help="A profile YAML.")],
    plot: Annotated[Path | None, typer.Option(help="Write PNG plots into this folder.")] = None,
    trials: Annotated[
        Path | None, typer.Option(help="Trials CSV for the plots (default: the one beside the profile).")
    ] = None,
    compare: Annotated[Path | None, typer.Option(help="Another profile to show side by side.")] = None,
    json_out: JsonOut = False,
) -> None:
    """Render a profile as tables; --plot writes pictures, --compare puts two profiles side by side."""
    with user_errors():
        from .profile import load_profile, profile_to_dict
        from .report import render_compare, render_profile, write_plots

        p = load_profile(profile)
        other = load_profile(compare) if compare else None
        if json_out:
            _print_json(profile_to_dict(p) if other is None else [profile_to_dict(p), profile_to_dict(other)])
        elif other is not None:
            render_compare(p, other, _console())
        else:
            render_profile(p, _console())
        if plot is not None:
            csv = trials or profile.with_suffix(".trials.csv")
            written = write_plots(p, plot, csv if csv.is_file() else None)
            if not json_out:
                for f in written:
                    _console().print(f"wrote {f}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
