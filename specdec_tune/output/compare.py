"""Two profiles side by side (`show --compare`): hardware, best config, speedup, tokens/s and
acceptance, the better one marked, and a warning when they are not comparable."""

from __future__ import annotations

import math
from collections.abc import Callable

from rich.console import Console
from rich.table import Table

from ..store.schema import Profile
from .fmt import num, styled, times

# keys of specdec_tune.hardware's fingerprint first, then common spellings
_DEVICE_KEYS = ("gpu_name", "cpu_model", "name", "device_name", "gpu", "cpu", "device")


def _device(p: Profile) -> str:
    for key in _DEVICE_KEYS:
        if p.hardware.get(key):
            return str(p.hardware[key])
    return "—"


def render_compare(a: Profile, b: Profile, console: Console) -> None:
    """Print two profiles side by side (hardware, best config, speedup, tokens/s, α) and mark the better."""
    t = Table(title="Profile comparison", title_justify="left")
    t.add_column("", style="bold")
    t.add_column(f"A: {a.hardware.get('slug')}")
    t.add_column(f"B: {b.hardware.get('slug')}")
    t.add_column("better", justify="center")

    def same(label: str, va: str, vb: str) -> None:
        t.add_row(label, va, vb, "" if va == vb else styled(("differs", "dim")))

    def higher(
        label: str, get: Callable[[Profile], float | None], fmt: Callable[[float | None], str]
    ) -> None:
        va, vb = get(a), get(b)
        if va is None or vb is None or math.isclose(va, vb, rel_tol=0.005, abs_tol=1e-9):
            t.add_row(label, fmt(va), fmt(vb), "≈" if va is not None and vb is not None else "")
        elif va > vb:
            t.add_row(label, styled((fmt(va), "bold green")), fmt(vb), styled(("A", "green")))
        else:
            t.add_row(label, fmt(va), styled((fmt(vb), "bold green")), styled(("B", "green")))

    same("hardware", str(a.hardware.get("slug")), str(b.hardware.get("slug")))
    same("device", _device(a), _device(b))
    same("target", a.target.name, b.target.name)
    same(
        "workload",
        f"{a.workload.name} (T={a.workload.temperature:g})",
        f"{b.workload.name} (T={b.workload.temperature:g})",
    )
    same("best config", a.best.config.label, b.best.config.label)
    higher("speedup", lambda p: p.best.metrics.speedup, times)
    higher("tokens/s", lambda p: p.best.metrics.tokens_per_s, lambda v: num(v, 1))
    higher("baseline tokens/s", lambda p: p.baseline.tokens_per_s, lambda v: num(v, 1))
    higher("acceptance α", lambda p: p.best.metrics.acceptance_rate, lambda v: num(v, 3))
    higher("mean accepted length τ", lambda p: p.best.metrics.mean_accepted_len, num)
    higher("predicted speedup", lambda p: p.best.metrics.predicted_speedup, times)
    console.print(t)
    if a.target.content_hash != b.target.content_hash:
        console.print(
            styled(("The profiles tune different target weights: tokens/s are not comparable.", "yellow"))
        )
    if a.workload.sha256 != b.workload.sha256 or a.workload.temperature != b.workload.temperature:
        console.print(
            styled(
                (
                    "The profiles were measured on different workloads: "
                    "α and speedup may differ for that alone.",
                    "yellow",
                )
            )
        )
