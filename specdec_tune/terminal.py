"""The CLI's terminal: consoles (rich, imported lazily), the error guard that turns exceptions into
exit codes, a spinner and a progress bar on stderr, JSON on stdout.

A user mistake (SpecDecError) is one red line and exit code 2; other hardware is exit code 3; an
unexpected failure (a bug, out of memory) is one line and exit code 4.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import typer

from .errors import OtherHardwareError, SpecDecError


def err_console() -> Any:
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def console() -> Any:
    from rich.console import Console

    return Console(highlight=False)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn project errors into one red line and an exit code; never a traceback for those."""
    try:
        yield
    except OtherHardwareError as exc:
        err_console().print(f"[red]error:[/red] {exc}", soft_wrap=True)
        raise typer.Exit(3) from None
    except SpecDecError as exc:
        from rich.markup import escape  # a message may hold brackets: pip install 'x[extra]'

        err_console().print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        err_console().print("[red]interrupted[/red]")
        raise typer.Exit(130) from None
    except (typer.Exit, typer.Abort):
        raise
    except Exception as exc:
        # Not a user mistake: a bug or the machine (e.g. out of memory). Exit 4 keeps it apart from
        # check's 1 (regression); SPECDEC_DEBUG=1 shows the traceback.
        import os

        if os.environ.get("SPECDEC_DEBUG"):
            raise
        err_console().print(
            f"[red]internal error:[/red] {type(exc).__name__}: {exc} (SPECDEC_DEBUG=1 shows the traceback)",
            soft_wrap=True,
        )
        raise typer.Exit(4) from None


@contextmanager
def spinner(text: str, quiet: bool) -> Iterator[None]:
    """A status line on stderr while measuring (none with --json, so stdout stays clean)."""
    if quiet:
        yield
        return
    with err_console().status(text):
        yield


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


def quiet_libraries() -> None:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("optuna").setLevel(logging.WARNING)


class CliProgress:
    """app.Progress drawn as a rich progress bar on stderr (nothing with --json)."""

    def __init__(self, json_out: bool, description: str, total: float) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            console=err_console(),
            disable=json_out,
            transient=True,
        )
        self.task = self.bar.add_task(description, total=total, info="")

    def __enter__(self) -> CliProgress:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.__exit__(*exc)

    def stage(self, label: str, fraction: float) -> None:
        self.bar.update(self.task, description="profiling", completed=fraction, total=1.0, info=label)

    def trial(self, done: int, total: int, best: float | None) -> None:
        info = f"best {best:.3f}×" if best else ""
        self.bar.update(self.task, description="searching", completed=done, total=total, info=info)

    def final(self, labels: list[str]) -> None:
        self.bar.update(self.task, description="final round", info=f"re-measuring {', '.join(labels)}")

    def note(self, text: str) -> None:
        err_console().print(f"[yellow]warning:[/yellow] {text}", soft_wrap=True)
