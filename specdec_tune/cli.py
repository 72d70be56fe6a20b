"""The `specdec-tune` command line: parse, call the library, render with rich. No logic lives here.

Heavy imports (torch, transformers, optuna) happen inside the commands so `--help` is instant.
A user mistake (SpecDecError) is one red line and exit code 2; other hardware is exit code 3.
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
    typer.Option("--target", "-t", help="Target model: folder or HF id in the local cache. Default: demo target."),
]
Device = Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.", envvar="SPECDEC_DEVICE")]
Dtype = Annotated[str, typer.Option(help="auto (fp32 on CPU, bf16 on CUDA), float32, bfloat16, float16.")]
WorkloadOpt = Annotated[str, typer.Option("--workload", "-w", help="Built-in name (demo-code, general) or a JSONL path.")]
MaxNew = Annotated[int, typer.Option("--max-new-tokens", "-n", help="Tokens to generate per prompt.")]
Temperature = Annotated[float, typer.Option(help="0 = greedy (exact match with the target).")]
Prompts = Annotated[int | None, typer.Option("--prompts", help="Use only the first N prompts of the workload.")]
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
) -> None:
    pass


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
            "--draft", "-d", help="A draft model (folder/HF id/demo name), prompt-lookup[:MIN-MAX] or layer-skip:K."
        ),
    ] = "draft-1l",
    gamma: Annotated[int, typer.Option("--gamma", "-g", help="Draft tokens per step (1..64).")] = 4,
    threshold: Annotated[float, typer.Option(help="Draft confidence early stop, [0, 1); 0 = off.")] = 0.0,
    temperature: Temperature = 0.0,
    max_new_tokens: MaxNew = 64,
    workload: WorkloadOpt = "demo-code",
    prompt: Annotated[str | None, typer.Option(help="A single prompt instead of a workload.")] = None,
    prompts: Prompts = None,
    repeats: Annotated[int, typer.Option(help="Timed repeats of each side (median and spread reported).")] = 3,
    seed: int = 0,
    compare_hf: Annotated[
        bool, typer.Option("--compare-hf", help="Also time transformers' assisted generation with the same settings.")
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
            raise SpecDecError("gamma must be an integer in 1..64 for bench (the baseline is always measured)")
        s = open_session(
            target, [draft], workload, max_new_tokens, temperature, device, dtype, prompts, prompt
        )
        spec = s.specs[0]
        drafter = build_drafter(spec, s.target.model, s.draft_modules)
        status = None if json_out else _console().status("measuring…")
        if status:
            status.start()
        try:
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
        finally:
            if status:
                status.stop()
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
