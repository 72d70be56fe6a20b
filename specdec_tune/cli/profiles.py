"""The commands that read a stored profile and measure nothing: `export` (a ready-to-run
deployment) and `show` (tables, trials, plots, two profiles side by side). `cli.main` registers them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .. import app as api
from ..output import tables
from ..output.categories import category_table, per_source_table
from ..output.compare import render_compare
from ..output.fmt import plain
from ..output.trials import trials_tables
from ..store.yamlio import profile_to_dict
from .options import JsonOut
from .terminal import console, error_line, print_json, user_errors


def export(
    profile: Annotated[Path, typer.Argument(help="A profile YAML written by `specdec-tune run`.")],
    to: Annotated[str, typer.Option("--to", help="hf, vllm, llamacpp, sglang or trtllm.")] = "hf",
    engine_version: Annotated[
        str | None,
        typer.Option(
            "--engine-version",
            help="Flag set of an older engine release, e.g. b8953 for llama.cpp (default: current).",
        ),
    ] = None,
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            help="command (a ready-to-run command or snippet), json (the same as data) or flags "
            "(the speculative settings alone, as before).",
        ),
    ] = "command",
    batch_size: Annotated[
        int | None,
        typer.Option(
            "--batch-size",
            min=1,
            help="The load to size the server for (default: the largest measured batch size where "
            "speculation won).",
        ),
    ] = None,
    no_schedule: Annotated[
        bool,
        typer.Option(
            "--no-schedule", help="No batch-size schedule: the best operating point for --batch-size."
        ),
    ] = False,
    json_out: JsonOut = False,
) -> None:
    """Print a ready-to-run deployment of the best config the engine runs as measured (gaps and a
    fallback are said on stderr). Exit 5 when nothing in the profile can be exported."""
    with user_errors():
        r = api.export(profile, to, engine_version, fmt, batch_size, not no_schedule)
        if json_out or fmt == "json":
            print_json(r.as_dict())
        elif r.text:
            typer.echo(plain(r.text.rstrip("\n")))
        if r.exported is None:
            error_line("nothing exported", r.nothing)
            raise typer.Exit(5)
        for w in r.warnings:
            error_line("note", w, "yellow")


def show(
    profile: Annotated[Path, typer.Argument(help="A profile YAML.")],
    plot: Annotated[Path | None, typer.Option(help="Write PNG plots into this folder.")] = None,
    trials: Annotated[
        Path | None,
        typer.Option(help="Trials CSV to analyse and plot (default: the one beside the profile)."),
    ] = None,
    compare: Annotated[Path | None, typer.Option(help="Another profile to show side by side.")] = None,
    index: Annotated[
        bool,
        typer.Option(
            "--index",
            help="PROFILE is a folder: write its README.md, one row per profile (the index of "
            "profiles/ is generated this way, never by hand).",
        ),
    ] = False,
    json_out: JsonOut = False,
) -> None:
    """Render a profile as tables (and its trials: best per draft and per γ); --plot writes pictures,
    --compare puts two profiles side by side, --index writes a folder's index."""
    with user_errors():
        if index:
            written = api.index_profiles(profile)
            if json_out:
                print_json({"index": str(written.path), "rows": written.rows})
            else:
                console().print(f"wrote {written.path} ({len(written.rows)} profiles)", markup=False)
            return
        r = api.show(profile, compare, trials, plot)
        for w in r.warnings:  # on stderr, so `--json` stays one document
            error_line("warning", w, "yellow")
        if json_out:
            print_json(
                profile_to_dict(r.profile)
                if r.other is None
                else [profile_to_dict(r.profile), profile_to_dict(r.other)]
            )
            return

        out = console()
        if r.other is not None:
            render_compare(r.profile, r.other, out)
        else:
            tables.render_profile(r.profile, out)

            for extra in (per_source_table(r.profile.best.metrics), category_table(r.profile)):
                if extra is not None:
                    out.print(extra)
            if r.trials is not None:
                for table in trials_tables(r.trials):
                    out.print(table)
        for f in r.plots:
            out.print(f"wrote {f}")
