"""Engine modes and the execution context: how target and draft forwards run, passed explicitly.

- `eager`: transformers' forward over a growing `DynamicCache` (rollback crops it), the batched
  engine over `rowcache.RowCache`; Llama-family drafts use the lean forward (`leandraft`).
- `static`: every cache preallocated (`slots.SlotCache`, per-row positions): rollback moves a
  length, nothing is copied or re-allocated inside the loop; forwards stay eager.
- `compiled`: static, and decode/verify forwards go through `torch.compile` at fixed shapes (CUDA:
  CUDA graphs; CPU: inductor with frozen, prepacked weights). On CUDA a draft model's forwards are
  compiled too; on a CPU a Llama-family draft keeps the lean forward. A compile that fails falls
  back to static with a warning, which the context records (and the profile with it).
- `auto`: resolved before a context is made (`auto.resolve_auto`).

A session makes one `ExecutionContext` (device, dtype, mode, capacity, compile fallbacks, its
cache registry) and hands it to whatever builds a cache or a drafter, the way a transformers
candidate generator keeps its config: nothing in `runtime` reads a mode from anywhere else.
"""

from __future__ import annotations

import warnings
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, get_args

import torch

from ...domain import CompileTime
from ...errors import SpecDecError
from .dynamic import cache_kwarg, new_cache
from .rowcache import RowCache
from .slots import SlotCache, round_up

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# `--engine`: how forwards run (not a serving engine of `run --for`, which is `serving/`)
EngineMode = Literal["auto", "eager", "static", "compiled"]
ENGINE_MODES: tuple[EngineMode, ...] = get_args(EngineMode)
DEFAULT_CAPACITY = 1024  # positions per row when nothing tells the cache how long sequences get


def check_engine_mode(name: str) -> str:
    if name not in ENGINE_MODES:
        raise SpecDecError(f"unknown engine mode '{name}': use {', '.join(ENGINE_MODES)}")
    return name


@dataclass
class AutoChoice:
    """How `auto` was resolved: what was compared (decode-step ms per mode), the choice, and
    whether it was measured now or remembered (and where)."""

    choice: str
    compared_ms: dict[str, float] = field(default_factory=dict)
    reason: str = ""  # "cuda", "no probe", "measured", "remembered"
    remembered_at: str | None = None

    def summary(self) -> str:
        """One line for the costs and the profile, e.g. "auto: static (measured decode step: eager
        1.21 ms, static 1.02 ms; remembered in ~/.cache/specdec-tune/engine-auto.json)"."""
        compared = ", ".join(f"{m} {ms:.3g} ms" for m, ms in self.compared_ms.items())
        detail = {"cuda": "CUDA", "no probe": "no model to time"}.get(self.reason, self.reason)
        if compared:
            detail = f"{detail} decode step: {compared}"
        if self.remembered_at:
            detail += f"; remembered in {self.remembered_at}"
        return f"auto: {self.choice} ({detail})"

    def as_dict(self) -> dict[str, Any]:
        return {
            "choice": self.choice,
            "compared_ms": dict(self.compared_ms),
            "reason": self.reason,
            "remembered_at": self.remembered_at,
        }


@dataclass
class ExecutionContext:
    """Everything that decides how a forward runs, made once per session and passed explicitly.

    `row_kv` and `seq_cache` build caches under this mode; static caches are kept in this
    context's registry (per model and row count), so their buffers and compiled graphs are made
    once per session, not once per process.
    """

    mode: str = "eager"  # eager, static or compiled (auto is resolved before it gets here)
    capacity: int = DEFAULT_CAPACITY  # longest sequence (prompt + budget + gamma + 1) expected
    device: str = "cpu"
    dtype: str = "auto"
    fallbacks: list[str] = field(default_factory=list)  # compile failures, each a one-line reason
    auto: AutoChoice | None = None  # set when the mode came from `auto`
    # Compiled: the graphs its caches built (one per model, row count and input width) and the
    # seconds their first calls took, all outside any timed region (`runtime.graphs`).
    graphs_built: int = 0
    compile_s: float = 0.0
    caches: weakref.WeakKeyDictionary = field(
        default_factory=weakref.WeakKeyDictionary, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        check_engine_mode(self.mode)
        if self.mode == "auto":
            raise SpecDecError("engine mode 'auto' must be resolved first (auto.resolve_auto)")
        self.capacity = max(1, int(self.capacity))

    @property
    def name(self) -> str:
        return self.mode

    @property
    def static(self) -> bool:
        return self.mode in ("static", "compiled")

    @property
    def compiled(self) -> bool:
        return self.mode == "compiled"

    def compile_time(self) -> CompileTime | None:
        """What this context's graph builds cost so far (a profile records it apart from the
        timings); None under the eager engine, 0 graphs under static."""
        if not self.static:
            return None
        return CompileTime(self.graphs_built, round(self.compile_s, 3))

    def compile_failed(self, reason: str) -> None:
        """A compile failed: the forward falls back (the cache does), the context remembers why."""
        line = reason.strip().splitlines()[0] if reason.strip() else "unknown error"
        if line not in self.fallbacks:
            self.fallbacks.append(line)
            warnings.warn(f"torch.compile failed, falling back to the static engine: {line}", stacklevel=2)

    def graph_built(self, seconds: float) -> None:
        """A compiled cache built a graph for a new input width in `seconds`."""
        self.graphs_built += 1
        self.compile_s += seconds

    def row_kv(self, model: PreTrainedModel, rows: int, capacity: int | None = None) -> RowCache | SlotCache:
        """The batch cache of `model` for `rows` rows under this mode, every row emptied."""
        if not self.static:
            return RowCache(model, rows)
        # One capacity for everything in the session (the larger of the context's and the
        # caller's), so compiled graphs are built once and reused.
        need = max(capacity or 0, self.capacity)
        per_model = self.caches.setdefault(model, {})
        kv = per_model.get(rows)
        if kv is None or kv.capacity < need:
            kv = SlotCache(
                model, rows, round_up(need, 64), self.compiled, self.compile_failed, self.graph_built
            )
            per_model[rows] = kv
        kv.reset()
        return kv

    def seq_cache(self, model: PreTrainedModel, capacity: int | None = None) -> SeqCache:
        """One sequence's cache of `model` under this mode."""
        return SeqCache(model, self, capacity)


class SeqCache:
    """One sequence's cache of a model under `ctx`'s mode: `prefill`, `forward`, `crop`.

    Eager: transformers' forward over a `DynamicCache`. Static/compiled: row 0 of a `SlotCache`;
    `width` pads a compiled forward to a fixed number of input slots (verification: gamma + 1).
    """

    def __init__(self, model: PreTrainedModel, ctx: ExecutionContext, capacity: int | None = None) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.slots = None
        if ctx.static:
            self.slots = ctx.row_kv(model, 1, capacity)
            self._counts: dict[int, Any] = {}  # width -> tensor([width]): none made per token
        else:
            self.cache = new_cache(model)
            self.kw = {cache_kwarg(model): self.cache, "use_cache": True}

    def prefill(self, ids: list[int]) -> None:
        """The cache holds exactly `ids` (a fresh sequence)."""
        if self.slots is not None:
            self.slots.prefill(0, ids)
        elif ids:
            x = torch.tensor([ids], dtype=torch.long, device=self.device)
            self.model(input_ids=x, logits_to_keep=1, **self.kw)

    def forward(self, x: torch.Tensor, width: int | None = None) -> torch.Tensor:
        """Logits (T, vocab) of the T new tokens `x` (1, T), which the cache then holds."""
        if self.slots is None:
            return self.model(input_ids=x, **self.kw).logits[0]
        t = x.shape[1]
        if width is not None and width > t and self.slots.compiled:
            x = torch.nn.functional.pad(x, (0, width - t))
            logits = self.slots.forward(x, self._count(width))[0]
            self.crop(width - t)
            return logits[:t]
        return self.slots.forward(x, self._count(t))[0]

    def _count(self, n: int) -> Any:
        count = self._counts.get(n)
        if count is None:
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
