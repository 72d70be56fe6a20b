"""`specdec-tune reference`: measure a profile's reference again on this machine (app.reference.rebase).
`cli.main` registers it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..app.common import check_writable
from ..app.reference import rebase
from ..measurepolicy import MEASURE_POLICY
from .options import Device, JsonOut
from .terminal import console, print_json, quiet_libraries, user_errors


def reference(
    profile: Annotated[Path, typer.Argument(help="A profile YAML written by `specdec-tune run`.")],
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Write the profile here (default: in place).")
    ] = None,
    processes: Annotated[
        int, typer.Option("--processes", min=2, max=8, help="Fresh processes to measure in.")
    ] = MEASURE_POLICY.reference_processes,
    device: Device = "auto",
    json_out: JsonOut = False,
) -> None:
    """Measure the profile's reference (its best config against plain decoding, in fresh processes)
    on this machine with this code, for `check` to judge against. A gate on changing CI runners runs
    this with the base revision's code, then `check` with the candidate's (docs/ci.md). Exit 6 when
    the machine was too busy to measure it."""
    with user_errors():
        quiet_libraries()
        if out is not None:
            check_writable(out)
        r = rebase(profile, out, processes, device=device)
        if json_out:
            print_json(
                {
                    "out": str(r.out), "speedups": r.speedups, "baseline_tokens_per_s": r.baseline_tokens_per_s,
                    "sliced": r.sliced, "note": r.note,
                }
            )  # fmt: skip
            return
        where = "on the check slice" if r.sliced else "with the engine's threads"
        speedups = ", ".join(f"{x:.3f}" for x in r.speedups)
        # soft_wrap: a path or a number list is never broken across lines (80 columns in CI)
        out = console()
        out.print(
            f"reference measured {where} in {len(r.baseline_tokens_per_s)} processes: speedup {speedups}",
            soft_wrap=True,
        )
        if r.note:
            out.print(f"note: {r.note}", soft_wrap=True, markup=False)
        out.print(f"wrote {r.out}", soft_wrap=True, markup=False)
