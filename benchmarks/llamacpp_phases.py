"""Where a llama.cpp `run` spends its time: the run's own phases timed by wrapping them (the costs
pass, noise and anchors, prompt processing and restores, server starts, exactness checks, the final
round), printed as they end and summed at the end, with the budget's note.

    python benchmarks/llamacpp_phases.py [--context-lengths 6144] [--budget 80] \
        [--workload long-code-edit] [-n 48] [--out /tmp/phases.yaml]

Measured with it (2026-12-03, 2-core VM, SmolLM2-135M, L 6144, budget 80 s): processing the 2
prompts 90 s, the rest of the costs pass 23 s, noise 15 s, 6 trials 89 s, the final round 107 s,
and the best's exactness over the 4 prompts the search never measured 168 s (since fixed).
"""

from __future__ import annotations

import argparse
import functools
import time
from pathlib import Path
from typing import Any

import specdec_tune.backends.llamacpp as session
import specdec_tune.measure.llamacpp.backend as engine
import specdec_tune.search.tuner as tuner
from specdec_tune import app
from specdec_tune.backends.base import Models, Progress

T0 = time.monotonic()
TOTALS: dict[str, float] = {}


def _clock() -> str:
    return f"{time.monotonic() - T0:7.1f}"


def timed(owner: Any, name: str, label: str) -> None:
    """Wrap `owner.name` so its seconds add up under `label` (a call over 2 s is printed)."""
    f = getattr(owner, name)

    @functools.wraps(f)
    def wrapper(*a: Any, **k: Any) -> Any:
        start = time.monotonic()
        try:
            return f(*a, **k)
        finally:
            took = time.monotonic() - start
            TOTALS[label] = TOTALS.get(label, 0.0) + took
            if took > 2:
                print(f"{_clock()} {label} took {took:.1f} s", flush=True)

    setattr(owner, name, wrapper)


class Printed(Progress):
    def stage(self, label: str, fraction: float) -> None:
        print(f"{_clock()} stage {label}", flush=True)

    def note(self, text: str) -> None:
        print(f"{_clock()} note {text}", flush=True)

    def trial(self, done: int, total: int, best: float | None) -> None:
        print(f"{_clock()} trial {done}/{total} best {best}", flush=True)

    def final(self, labels: list[str]) -> None:
        print(f"{_clock()} final round {labels}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context-lengths", default="6144")
    ap.add_argument("--budget", type=float, default=80.0)
    ap.add_argument("--workload", default="long-code-edit")
    ap.add_argument("-n", "--max-new-tokens", type=int, default=48)
    ap.add_argument("--out", type=Path, default=Path("/tmp/llamacpp_phases.yaml"))
    a = ap.parse_args()
    timed(session.LlamaCppSession, "costs", "costs pass")
    timed(session.LlamaCppSession, "noise_and_anchors", "noise and anchors")
    timed(session.LlamaCppSession, "exactness", "the best's exactness")
    timed(tuner, "final_round", "final round")
    timed(engine.LlamaCppBackend, "exactness", "exactness checks")
    timed(engine.LlamaCppBackend, "_server", "server starts")
    timed(engine.LlamaCppBackend, "restore", "prompt processing and restores")
    models = Models(
        target="smollm2-135m", workload=a.workload, backend="llamacpp", max_new_tokens=a.max_new_tokens
    )
    lengths = [int(x) for x in a.context_lengths.split(",")]
    out = app.tune(
        models,
        app.TuneSettings(),
        out=a.out,
        progress=Printed(),
        budget_s=a.budget,
        envelope=app.Envelope(context_lengths=lengths),
    )
    print(f"{_clock()} done; seconds by phase:", {k: round(v, 1) for k, v in TOTALS.items()})
    print(out.profile.search.budget_note)


if __name__ == "__main__":
    main()
