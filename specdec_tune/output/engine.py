"""What `show` says about the engine that measured a profile: its build and threads, how exact its
speculation was at T = 0, and how well the cost model fitted in it predicted the measured configs."""

from __future__ import annotations

from typing import Any

from ..store.schema import Profile


def engine_rows(p: Profile) -> list[tuple[str, str]]:
    """Rows for the run table ([] for a profile of our own engine, whose backend section is empty)."""
    b = p.backend
    if not b.as_dict():
        return []
    build = b.build
    rows = [
        (
            "engine",
            f"{b.name} {build.get('package', '')}".rstrip()
            + (f", binary {build['binary_sha256']}" if build.get("binary_sha256") else "")
            + (f", {b.threads} threads" if b.threads else ""),
        )
    ]
    exact = b.exactness
    if exact:
        words = (
            f"{exact.get('identical', '?')} of {exact.get('prompts', '?')} prompts token-identical to plain"
        )
        if not exact.get("token_exact", True):
            words += f" ({exact.get('near_ties', 0)} part at a near-tie of the plain top-2)"
        rows.append(("exactness at T = 0", f"{exact.get('config', '')}: {words}".lstrip(": ")))
    defaults = b.engine_defaults
    if defaults:
        rows.append(
            (
                "engine defaults",
                "; ".join(default_words(d) for d in defaults) + " (final round, head to head)",
            )
        )
    model = b.cost_model
    if model:
        rows.append(("cost model", cost_model_words(model)))
    elif b.cost_model_error is not None:
        rows.append(("cost model", f"median error {b.cost_model_error:.0%} over the measured configs"))
    return rows


def cost_model_words(model: dict[str, Any]) -> str:
    """The engine cost model's fit in words: its errors over the measured configs and its reason."""
    words = f"median error {model.get('median_error', 0.0):.0%}, worst {model.get('worst_error', 0.0):.0%}"
    words += f" over {model.get('configs', 0)} measured configs"
    if model.get("reason"):
        words += f"; the best: {model['reason']}"
    return words


def default_words(row: dict[str, Any]) -> str:
    """One engine default as measured: "ngram-mod:24:48 γ64 1.257× [1.20, 1.31]"."""
    iv = row.get("interval") or []
    return f"{row.get('config', '?')} {row.get('speedup', 0.0):.3f}×" + (
        f" [{iv[0]:.2f}, {iv[1]:.2f}]" if len(iv) == 2 else ""
    )
