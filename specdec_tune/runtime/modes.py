"""Engine modes: how target and draft forwards run while anything is decoded or measured.

- `eager`: transformers' forward over a growing `DynamicCache` (rollback crops it), the batched
  engine over `rowcache.RowCache`; Llama-family drafts use the lean forward (`leandraft`).
- `static`: every cache preallocated (`slots.SlotCache`, per-row positions): rollback moves a
  length, nothing is copied or re-allocated inside the loop; forwards stay eager.
- `compiled`: static, and decode/verify forwards go through `torch.compile` at fixed shapes (CUDA:
  CUDA graphs; CPU: inductor with frozen, prepacked weights). A compile that fails falls back to
  static with a warning, which the profile records.
- `auto`: compiled on CUDA; on CPU the faster of eager and static by a quick decode-step timing
  (compiled is left out there: it costs seconds per graph shape; ask for it by name).

The mode is set for a block of work with `engine_mode(...)` (the app layer does, per command) and
read by the runtime where it builds caches, so every measuring path (bench, costs, surface,
search, check) runs the same forward the profile records.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import SpecDecError

ENGINE_MODES = ("auto", "eager", "static", "compiled")
DEFAULT_CAPACITY = 1024  # positions per row when nothing tells the cache how long sequences get


@dataclass
class EngineMode:
    name: str = "eager"  # eager, static or compiled (auto is resolved before it gets here)
    capacity: int = DEFAULT_CAPACITY  # longest sequence (prompt + budget + gamma + 1) expected
    fallbacks: list[str] = field(default_factory=list)  # compile failures, each a one-line reason

    @property
    def static(self) -> bool:
        return self.name in ("static", "compiled")

    @property
    def compiled(self) -> bool:
        return self.name == "compiled"


_current = EngineMode()


def current() -> EngineMode:
    """The engine mode in force (eager unless a caller set another)."""
    return _current


def check_engine_mode(name: str) -> str:
    if name not in ENGINE_MODES:
        raise SpecDecError(f"unknown engine mode '{name}': use {', '.join(ENGINE_MODES)}")
    return name


@contextlib.contextmanager
def engine_mode(name: str, capacity: int = DEFAULT_CAPACITY) -> Iterator[EngineMode]:
    """Run the block under engine mode `name` (eager, static or compiled)."""
    global _current
    before = _current
    try:
        yield use(name, capacity)
    finally:
        _current = before


def use(name: str, capacity: int = DEFAULT_CAPACITY) -> EngineMode:
    """Put engine mode `name` in force for what follows (a command's whole run; the app layer
    calls this once per use case after loading the models)."""
    global _current
    check_engine_mode(name)
    if name == "auto":
        raise SpecDecError("engine mode 'auto' must be resolved first (modes.resolve_auto)")
    _current = EngineMode(name, max(1, int(capacity)))
    return _current


def compile_failed(reason: str) -> None:
    """A compile failed: the forward falls back (the caller does), the mode remembers why."""
    line = reason.strip().splitlines()[0] if reason.strip() else "unknown error"
    if line not in _current.fallbacks:
        _current.fallbacks.append(line)
        warnings.warn(f"torch.compile failed, falling back to the static engine: {line}", stacklevel=2)


def row_kv(model: Any, rows: int, capacity: int | None = None) -> Any:
    """The batch cache of `model` for `rows` rows under the current mode."""
    mode = _current
    if not mode.static:
        from .rowcache import RowCache

        return RowCache(model, rows)
    from .slots import slot_cache

    # One capacity for everything in the block (the larger of the block's and the caller's), so
    # compiled graphs are built once and reused.
    return slot_cache(model, rows, max(capacity or 0, mode.capacity), compiled=mode.compiled)


class SeqCache:
    """One sequence's cache of a model under the current mode: `prefill`, `forward`, `crop`.

    Eager: transformers' forward over a `DynamicCache`. Static/compiled: row 0 of a `SlotCache`;
    `width` pads a compiled forward to a fixed number of input slots (verification: gamma + 1).
    """

    def __init__(self, model: Any, capacity: int | None = None) -> None:

        self.model = model
        self.device = next(model.parameters()).device
        mode = _current
        self.slots = None
        if mode.static:
            self.slots = row_kv(model, 1, capacity)
            self._counts: dict[int, Any] = {}  # width -> tensor([width]): none made per token
        else:
            from .cache import cache_kwarg, new_cache

            self.cache = new_cache(model)
            self.kw = {cache_kwarg(model): self.cache, "use_cache": True}

    def prefill(self, ids: list[int]) -> None:
        """The cache holds exactly `ids` (a fresh sequence)."""
        import torch

        if self.slots is not None:
            self.slots.prefill(0, ids)
        elif ids:
            x = torch.tensor([ids], dtype=torch.long, device=self.device)
            self.model(input_ids=x, logits_to_keep=1, **self.kw)

    def forward(self, x: Any, width: int | None = None) -> Any:
        """Logits (T, vocab) of the T new tokens `x` (1, T), which the cache then holds."""
        if self.slots is None:
            return self.model(input_ids=x, **self.kw).logits[0]
        t = x.shape[1]
        if width is not None and width > t and self.slots.compiled:
            import torch

            x = torch.nn.functional.pad(x, (0, width - t))
            logits = self.slots.forward(x, self._count(width))[0]
            self.crop(width - t)
            return logits[:t]
        return self.slots.forward(x, self._count(t))[0]

    def _count(self, n: int) -> Any:
        count = self._counts.get(n)
        if count is None:
            import torch

            count = self._counts[n] = torch.tensor([n], dtype=torch.long, device=self.device)
        return count

    def crop(self, n: int) -> None:
        """Drop the last n tokens (n >= 0)."""
        if n <= 0:
            return
        if self.slots is None:
            self.cache.crop(-n)
        else:
            self.slots.truncate(self.slots.lengths - n)


def resolve_auto(device: str, probe: Any | None = None) -> str:
    """`auto` -> compiled on CUDA; on CPU the faster of eager and static per decode step of `probe`
    (a model) when given, else eager. The CPU decision is kept (in this process and in
    ~/.cache/specdec-tune/engine-auto.json) per model shape, so a resumed study and `check` see the
    mode the search used."""
    if str(device).startswith("cuda"):
        return "compiled"
    if probe is None:
        return "eager"
    import json
    import os
    from pathlib import Path

    import torch

    params = sum(p.numel() for p in probe.parameters())
    key = (
        f"{device}:{type(probe).__name__}:{params}:{next(probe.parameters()).dtype}:{torch.get_num_threads()}"
    )
    path = Path(os.path.expanduser("~")) / ".cache" / "specdec-tune" / "engine-auto.json"
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if known.get(key) in ("eager", "static"):
        return known[key]
    eager, static = _decode_step_ms("eager", probe), _decode_step_ms("static", probe)
    # Static must win clearly: a tie on a noisy machine should not flip the mode between runs.
    choice = "static" if static < 0.97 * eager else "eager"
    known[key] = choice
    try:  # written whole and renamed into place: a reader never sees half a file
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass
    return choice


def _decode_step_ms(name: str, model: Any) -> float:
    import time

    import torch

    with engine_mode(name, 256):
        seq = SeqCache(model)
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
    return rest[len(rest) // 2]
