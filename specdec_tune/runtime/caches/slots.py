"""A preallocated KV cache for B rows at their own positions, over any transformers decoder.

The `static` and `compiled` engine modes run target and drafts on this instead of a growing
`DynamicCache` (`rowcache.RowCache`, the `eager` mode). Every layer's keys and values live in
one (B, heads, capacity, dim) buffer allocated once; column c of row r holds row r's position c.
A forward writes each row's new tokens at that row's positions (one scatter per layer) and attends
through a mask built from the positions alone, so:

- rollback after a rejected draft and the end of a request only move a row's length (no copy,
  no crop): stale columns past the length are never visible and are overwritten next;
- rows of different lengths, and padding past a row's real tokens, share one fixed-shape forward:
  verification always feeds gamma + 1 slots per row, so each (B, gamma) is one compiled graph.

transformers' own `StaticCache` shares one write position across the batch (`cumulative_length`),
which cannot hold ragged rows; this cache plugs into the same `Cache` / `CacheLayerMixin`
interface with per-row positions, so every architecture that attends through `Cache.update`
(Llama, Qwen2, Mistral, GPT-2, Gemma, Phi, ...) runs on it unchanged. Models that keep other
state (sliding windows shorter than the capacity, recurrent layers) are refused with a message
that names `--engine eager`.

With `compiled`, decode forwards go through `torch.compile` (CUDA: mode "reduce-overhead", i.e.
CUDA graphs; CPU: inductor) at the fixed input widths the callers use (1 for a decode step or a
draft step, gamma + 1 for verification and a draft's catch-up); a refill's prefill stays eager.
The warm-up before anything is timed builds them; `compiles` counts the graphs built, so a
recompile inside a timed loop shows as a change of that count (`compile_events`).
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ...errors import SpecDecError
from ..models.devices import cache_dir
from .dynamic import cache_kwarg

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def _text_config(model: PreTrainedModel) -> Any:
    cfg = model.config
    return cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg


def check_static(model: PreTrainedModel, capacity: int) -> None:
    """Refuse, with a message naming `--engine eager`, a model this cache cannot serve exactly."""
    cfg = _text_config(model)
    name = type(model).__name__
    types = list(getattr(cfg, "layer_types", None) or [])
    if any(t not in ("full_attention", "sliding_attention") for t in types):
        raise SpecDecError(
            f"{name} has layers without a plain KV cache ({', '.join(sorted(set(types)))}): "
            "it cannot use a static cache; use --engine eager"
        )
    window = getattr(cfg, "sliding_window", None)
    sliding = "sliding_attention" in types or (window and getattr(cfg, "use_sliding_window", True))
    if sliding and window and capacity > int(window):
        raise SpecDecError(
            f"{name} attends through a sliding window of {window} tokens, shorter than the {capacity} "
            "this workload needs: the static cache holds full attention only; use --engine eager"
        )
    limit = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
    if limit and capacity > int(limit):
        raise SpecDecError(
            f"the workload needs {capacity} positions but {name} has only {limit}: shorten the "
            "prompts or --max-new-tokens"
        )


@functools.cache  # one class per process: a class, not state
def _layer_class() -> type:
    from transformers.cache_utils import CacheLayerMixin

    class SlotLayer(CacheLayerMixin):
        """One layer's keys and values for every row; `owner` says where this forward writes."""

        is_compileable = True
        is_croppable = False
        is_sliding = False

        def __init__(self, owner: SlotCache) -> None:
            super().__init__()
            self.owner = owner

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            o = self.owner
            heads = key_states.shape[1]
            self.keys = key_states.new_zeros(o.rows, heads, o.capacity, key_states.shape[-1])
            self.values = value_states.new_zeros(o.rows, heads, o.capacity, value_states.shape[-1])
            if key_states.device.type == "cuda":  # CUDA graphs need fixed addresses
                torch._dynamo.mark_static_address(self.keys)
                torch._dynamo.mark_static_address(self.values)
            self.is_initialized = True

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            o = self.owner
            keys, values = self.keys, self.values
            if o.row is not None:  # a one-row prefill writes into that row's slice (a view)
                keys, values = keys[o.row : o.row + 1], values[o.row : o.row + 1]
            at = o.write_at[:, None, :, None]
            keys.scatter_(2, at.expand(-1, keys.shape[1], -1, keys.shape[3]), key_states)
            values.scatter_(2, at.expand(-1, values.shape[1], -1, values.shape[3]), value_states)
            return keys[:, :, : o.visible], values[:, :, : o.visible]

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return self.owner.visible, 0

        def get_seq_length(self) -> int:
            return self.owner.visible

        def get_max_length(self) -> int:
            return self.owner.capacity

    return SlotLayer


def round_up(n: int, to: int) -> int:
    return -(-n // to) * to


class SlotCache:
    """The batch's cache of one model: `prefill` a row, `forward` new tokens, `truncate` rows.

    The interface of `rowcache.RowCache`, so the batched engine and its drafters take either.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        rows: int,
        capacity: int,
        compiled: bool = False,
        on_compile_failure: Callable[[str], None] | None = None,
        on_graph_built: Callable[[float], None] | None = None,
    ) -> None:
        if rows < 1:
            raise SpecDecError(f"batch size must be >= 1, got {rows}")
        check_static(model, capacity)
        from transformers.cache_utils import Cache

        self.model, self.rows, self.capacity = model, rows, capacity
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.kw = cache_kwarg(model)
        n_layers = int(_text_config(model).num_hidden_layers)
        self.cache = Cache(layers=[_layer_class()(self) for _ in range(n_layers)])
        self.lengths = torch.zeros(rows, dtype=torch.long, device=self.device)
        self.cols = torch.arange(capacity, device=self.device)
        self.write_at = self.cols[None, :1].expand(rows, 1)
        self.row: int | None = None  # set while one row is prefilled
        self.visible = capacity  # key columns attended to by this forward
        self.compiled = compiled
        self.on_compile_failure = on_compile_failure  # the execution context records the reason
        self.on_graph_built = on_graph_built  # and the seconds each new width's first call took
        self.compiles = 0  # compiled graphs built (one per input width), for recompile accounting
        self._graphs: set[int] = set()
        self._fn = self._step
        if compiled:
            self._fn = _compile(self._step, self.device)
        # Allocate every layer's buffers now, outside any compiled region, as normal tensors (made
        # under inference mode they could never be written outside it).
        with torch.no_grad():
            self._prefill(0, [0])
        self.reset()

    def reset(self) -> None:
        self.lengths = torch.zeros(self.rows, dtype=torch.long, device=self.device)

    def _step(self, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """One forward at positions `pos` (B, T) over the first `visible` columns."""
        allowed = self.cols[None, None, None, : self.visible] <= pos[:, None, :, None]
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)
        mask = mask.masked_fill(~allowed, torch.finfo(self.dtype).min)
        out = self.model(
            input_ids=tokens, attention_mask=mask, position_ids=pos, use_cache=True, **{self.kw: self.cache}
        )
        return out.logits

    @torch.inference_mode()
    def prefill(self, row: int, ids: list[int]) -> None:
        """Make `row` hold exactly `ids` at positions 0..n-1 (eager: prompts vary in length)."""
        self._prefill(row, ids)

    def _prefill(self, row: int, ids: list[int]) -> None:
        n = len(ids)
        self.lengths[row] = 0
        if n == 0:
            return
        self._ensure(n)
        pos = self.cols[None, :n]
        self.row, self.write_at, self.visible = row, pos, n
        try:
            self.model(
                input_ids=torch.tensor([ids], dtype=torch.long, device=self.device),
                attention_mask=torch.zeros(1, 1, n, n, dtype=self.dtype, device=self.device).masked_fill(
                    self.cols[None, None, None, :n] > pos[:, None, :, None], torch.finfo(self.dtype).min
                ),
                position_ids=pos,
                logits_to_keep=1,
                use_cache=True,
                **{self.kw: self.cache},
            )
        finally:
            self.row = None
        self.lengths[row] = n

    def _ensure(self, end: int) -> None:
        if end > self.capacity:
            raise SpecDecError(
                f"the static cache holds {self.capacity} positions per row but this sequence needs {end}: "
                "a longer prompt or budget than the workload declared"
            )

    def forward(self, tokens: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Feed row r's first counts[r] tokens of `tokens` (B, T) after its held ones; the rest of
        each row is padding whose writes land past the row's length. Returns logits (B, T, vocab)."""
        t = width = tokens.shape[1]
        end = int(self.lengths.max()) + t  # the one host sync: the longest row after this forward
        self._ensure(end)
        # Padding slots past the capacity write into the last column, which no row reaches.
        pos = (self.lengths[:, None] + self.cols[None, :width]).clamp_max(self.capacity - 1)
        self.write_at = pos
        self.visible = self.capacity if self.compiled else min(self.capacity, round_up(end, 32))
        if self.compiled and width not in self._graphs:
            self._graphs.add(width)
            self.compiles += 1
            t0 = time.perf_counter()
            try:
                logits = self._fn(tokens, pos)
            except Exception as exc:  # a compiler bug or a missing toolchain: stay exact, go static
                if self.on_compile_failure is not None:
                    self.on_compile_failure(f"{type(self.model).__name__}: {type(exc).__name__}: {exc}")
                self.compiled, self._fn = False, self._step
                logits = self._step(tokens, pos)
            if self.compiled and self.on_graph_built is not None:  # the compile and one forward
                self.on_graph_built(time.perf_counter() - t0)
        else:
            logits = self._fn(tokens, pos)
        if self.compiled and self.device.type == "cuda":
            logits = logits.clone()  # a CUDA graph's output is overwritten by its next replay
        self.lengths = self.lengths + counts
        return logits[:, :t]

    def truncate(self, lengths: torch.Tensor) -> None:
        """Row r keeps its first lengths[r] tokens: only the length moves."""
        self.lengths = lengths.clone()

    def warm(self, widths: list[int]) -> None:
        """Build (compile) and run the forward at every input width in `widths` once, outside any
        timed region; every row is emptied afterwards."""
        with torch.inference_mode():
            for t in sorted(set(widths)):
                tokens = torch.zeros(self.rows, t, dtype=torch.long, device=self.device)
                counts = torch.full((self.rows,), t, dtype=torch.long, device=self.device)
                self.forward(tokens, counts)
                self.reset()


def _compile(fn: Callable[..., Any], device: torch.device) -> Callable[..., Any]:
    """torch.compile at fixed shapes; the inductor cache is kept between runs (on disk)."""
    import torch._dynamo.config as dynamo_config

    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir() / "inductor"))
    # One graph per (model, B, width): the tuner visits many, so the default limit of 8 per code
    # object would silently fall back to eager.
    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 1024)
    dynamo_config.accumulated_recompile_limit = max(dynamo_config.accumulated_recompile_limit, 4096)
    if device.type == "cuda":
        return torch.compile(fn, mode="reduce-overhead", dynamic=False)
    import torch._inductor.config as inductor_config

    # Weights become constants of the graph, prepacked for the CPU's matmul kernels: measured on
    # the demo target, one decode step 3.8 ms frozen against 4.6 ms unfrozen (2-core EPYC).
    inductor_config.freezing = True
    return torch.compile(fn, dynamic=False)


def compile_events() -> int:
    """Graphs dynamo has compiled in this process (a counter that grows with every recompile)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"].get("unique_graphs", 0))
