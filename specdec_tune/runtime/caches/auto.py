"""`--engine auto`: compiled on CUDA; on CPU the faster of eager and static per decode step.

The CPU decision is remembered per model shape in a JSON file (default
`$XDG_CACHE_HOME/specdec-tune/engine-auto.json`, else `~/.cache/specdec-tune/`; the caller may
name another), so a resumed study and `check` see the mode the search used. The returned
`AutoChoice` says what was compared and why, for the costs and the profile.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ...atomic import atomic_write_text, locked
from ...errors import SpecDecError
from ..models.devices import cache_dir
from .modes import AutoChoice, ExecutionContext

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# Static must win clearly: a tie on a noisy machine should not flip the mode between runs.
STATIC_MARGIN = 0.97


def default_auto_path() -> Path:
    return cache_dir() / "engine-auto.json"


def resolve_auto(
    device: str, probe: PreTrainedModel | None = None, remember_at: str | Path | None = None
) -> AutoChoice:
    """`auto` -> compiled on CUDA; on CPU the faster of eager and static per decode step of
    `probe` (a model) when given, else eager. `remember_at` is the JSON file that keeps CPU
    decisions (default `default_auto_path()`)."""
    if str(device).startswith("cuda"):
        return AutoChoice("compiled", reason="cuda")
    if probe is None:
        return AutoChoice("eager", reason="no probe")
    path = Path(remember_at) if remember_at is not None else default_auto_path()
    params = sum(p.numel() for p in probe.parameters())
    dtype = next(probe.parameters()).dtype
    key = f"{device}:{type(probe).__name__}:{params}:{dtype}:{torch.get_num_threads()}"
    known = _read(path)
    if known.get(key) in ("eager", "static"):
        return AutoChoice(known[key], reason="remembered", remembered_at=str(path))
    compared = {m: _decode_step_ms(m, probe) for m in ("eager", "static")}
    choice = "static" if compared["static"] < STATIC_MARGIN * compared["eager"] else "eager"
    _remember(path, key, choice)
    return AutoChoice(choice, compared, reason="measured", remembered_at=str(path))


def _read(path: Path) -> dict[str, str]:
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return known if isinstance(known, dict) else {}


def _remember(path: Path, key: str, choice: str) -> None:
    """Add one decision to the file. Read again under the file's lock, so a decision another
    process wrote since our first read is kept, and written atomically."""
    try:
        with locked(path):
            known = _read(path)
            known[key] = choice
            atomic_write_text(path, json.dumps(known, indent=1))
    except (SpecDecError, OSError):
        pass  # an unwritable cache folder only costs a re-measurement next time


def _decode_step_ms(name: str, model: PreTrainedModel) -> float:
    """Median ms of one decode step of `model` after 128 tokens under engine mode `name`."""
    seq = ExecutionContext(name, 256).seq_cache(model)
    seq.prefill([1] * 128)
    x = torch.ones(1, 1, dtype=torch.long, device=seq.device)
    times = []
    with torch.inference_mode():
        for _ in range(25):
            t0 = time.perf_counter()
            seq.forward(x)
            seq.crop(1)
            times.append(time.perf_counter() - t0)
    rest = sorted(times[5:])
    return rest[len(rest) // 2] * 1e3
