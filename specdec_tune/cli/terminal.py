"""The CLI's terminal: consoles (rich, imported lazily), the error guard that turns exceptions into
exit codes, a spinner and a progress bar on stderr, JSON on stdout.

A user mistake (SpecDecError) is one red line and exit code 2; other hardware is exit code 3; an
unexpected failure (a bug, out of memory) is one line and exit code 4.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import typer

from ..errors import OtherHardwareError, SpecDecError, Unsettled
from ..output.fmt import plain, styled

# The width stdout is drawn at when nothing gives one (a pipe or a file, no COLUMNS): wide enough
# that no table row is folded, so a config name or a number is always on one line, whole.
UNCUT_WIDTH = 10_000


@functools.cache
def _console_class() -> Any:
    from rich.console import Console
    from rich.table import Table

    class SafeConsole(Console):
        """A console that never parses markup or emoji codes and shows control characters as
        escapes, so a name from a profile, study or exception is printed as it is. Styling is
        done with Text (output.fmt.styled), never with markup in strings.

        It never cuts a table cell with an ellipsis either: a cell wider than its column folds onto
        the next line (rich's default would print `hybrid:prompt-lookup:3-4+draft-1l γ7 t=0…`, a
        config name that no longer names the config)."""

        def render_str(self, text: str, **kwargs: Any) -> Any:
            kwargs["markup"] = False
            kwargs["emoji"] = False
            return super().render_str(plain(text), **kwargs)

        def print(self, *objects: Any, **kwargs: Any) -> None:
            for obj in objects:
                if isinstance(obj, Table):
                    for column in obj.columns:
                        if column.overflow == "ellipsis":
                            column.overflow = "fold"
            super().print(*objects, **kwargs)

    return SafeConsole


def err_console() -> Any:
    return _console_class()(stderr=True, highlight=False, markup=False, emoji=False)


def console() -> Any:
    """stdout's console. On a terminal (or with COLUMNS set) rich draws at that width, folding what
    does not fit; piped to a file or another program rich would draw at 80 columns, so there it
    draws at UNCUT_WIDTH: every table at its full width, as a script or a log reads it."""
    out = _console_class()(highlight=False, markup=False, emoji=False)
    if not out.is_terminal and not os.environ.get("COLUMNS"):
        out.width = UNCUT_WIDTH
    return out


_MAX_MESSAGE = 2000  # characters of one error line; a crafted value must not flood the log


def error_line(label: str, message: object, style: str = "red") -> None:
    """`label: message` as one line on stderr. Cannot fail: a message that will not render is
    written as plain text, one that will not even turn into a string is replaced by its type."""
    try:
        text = str(message)
    except Exception:  # a broken __str__ must not replace the error being reported
        text = f"<{type(message).__name__}>"
    text = " ".join(text.split())  # one line, whatever the message held
    if len(text) > _MAX_MESSAGE:
        text = text[:_MAX_MESSAGE] + f"… ({len(text) - _MAX_MESSAGE} more characters)"
    try:
        head = f"{label}:" if text else label
        err_console().print(styled((head, style), " " if text else "", text), soft_wrap=True)
    except Exception:
        with suppress(Exception):
            sys.stderr.write(f"{label}: {plain(text)}\n" if text else f"{label}\n")


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn project errors into one red line and an exit code; never a traceback for those."""
    try:
        yield
    except OtherHardwareError as exc:
        error_line("error", exc)
        raise typer.Exit(3) from None
    except Unsettled as exc:
        error_line("inconclusive", exc, style="yellow")
        raise typer.Exit(6) from None
    except SpecDecError as exc:
        error_line("error", exc)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        error_line("interrupted", "")
        raise typer.Exit(130) from None
    except (typer.Exit, typer.Abort):
        raise
    except Exception as exc:
        if _while_interrupted(exc):  # raised while an interrupt unwound: the interrupt
            error_line("interrupted", "")
            raise typer.Exit(130) from None
        # Not a user mistake: a bug or the machine (e.g. out of memory). Exit 4 keeps it apart from
        # check's 1 (regression); SPECDEC_DEBUG=1 shows the traceback.
        if os.environ.get("SPECDEC_DEBUG"):
            raise
        error_line(
            "internal error", f"{type(exc).__name__}: {_safe_str(exc)} (SPECDEC_DEBUG=1 shows the traceback)"
        )
        raise typer.Exit(4) from None


def _while_interrupted(exc: BaseException) -> bool:
    """Whether `exc` was raised while a KeyboardInterrupt (Ctrl-C, or SIGTERM as app.workers turns
    it) was being handled. Optuna 5.1's `_run_trial` reads an unbound `updated_state` in a `finally`
    when the interrupt lands inside its tell, and the UnboundLocalError replaces the interrupt: a
    SIGTERM of a run then exited 4, "internal error", once in a CI run (stop 62)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__context__
    return False


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        return "<unprintable>"


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
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            TextColumn("{task.fields[info]}", markup=False),
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
        self.bar.update(self.task, description="final round", info=plain(f"re-measuring {', '.join(labels)}"))

    def note(self, text: str) -> None:
        error_line("warning", text, "yellow")
