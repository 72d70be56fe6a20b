"""`specdec-tune studies list|show|delete`: inspect and prune the Optuna studies in a storage."""

from __future__ import annotations

from typing import Annotated

import typer

from ..app.studies import delete_studies, list_studies, show_study
from ..errors import SpecDecError
from ..output.studies import studies_table, study_tables
from .options import JsonOut, StorageUrl
from .terminal import console, print_json, user_errors

studies_app = typer.Typer(no_args_is_help=True, help="Inspect and prune the Optuna studies in a storage.")


@studies_app.command("list")
def studies_list(storage: StorageUrl = None, json_out: JsonOut = False) -> None:
    """List the studies: trials by state, best speedup, start time."""
    with user_errors():
        rows = list_studies(storage)
        if json_out:
            print_json(rows)
        else:
            console().print(studies_table(rows))


@studies_app.command("show")
def studies_show(
    name: Annotated[str, typer.Argument(help="Study name.")],
    storage: StorageUrl = None,
    json_out: JsonOut = False,
) -> None:
    """Show one study: its settings, final round, lost trials and every trial."""
    with user_errors():
        info = show_study(name, storage)
        if json_out:
            print_json(info)
            return
        for table in study_tables(info):
            console().print(table)


@studies_app.command("delete")
def studies_delete(
    names: Annotated[list[str] | None, typer.Argument(help="Study names.")] = None,
    all_studies: Annotated[
        bool, typer.Option("--all", help="Delete every study specdec-tune created in the storage.")
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Really delete (required).")] = False,
    force: Annotated[bool, typer.Option("--force", help="Delete even a study with running trials.")] = False,
    storage: StorageUrl = None,
    json_out: JsonOut = False,
) -> None:
    """Delete studies (their trials and attributes) from the storage. Needs --yes."""
    with user_errors():
        if not yes:
            raise SpecDecError("deleting studies cannot be undone: pass --yes to confirm")
        gone = delete_studies(names or [], storage, all_studies, force)
        if json_out:
            print_json({"deleted": gone})
        else:
            for n in gone:
                console().print(f"deleted {n}")
