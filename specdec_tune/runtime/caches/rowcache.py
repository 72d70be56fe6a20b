"""A KV cache for B rows that decode at their own pace, over any transformers causal LM.

All rows share one `DynamicCache` whose columns are common to the batch; `pos_at[r, c]` says
which position of row r column c holds (-1: nothing). A forward feeds every row's new tokens at
that row's own positions (explicit position ids, a 4-D additive mask built from `pos_at`), so
rows with different lengths and different numbers of new tokens share one forward. Rollback
clears a row's columns past its new length (no copy); a row is refilled by prefilling its prompt
alone and copying the keys and values in. Columns no row uses any more are squeezed out when
they make up most of the cache.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ...errors import SpecDecError
from .dynamic import cache_kwarg, new_cache

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class RowCache:
    """The batch's cache of one model: `prefill` a row, `forward` new tokens, `truncate` rows."""

    def __init__(self, model: PreTrainedModel, rows: int) -> None:
        if rows < 1:
            raise SpecDecError(f"batch size must be >= 1, got {rows}")
        self.model, self.rows = model, rows
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.kw = cache_kwarg(model)
        self.cache = new_cache(model)
        self.pos_at = torch.full((rows, 0), -1, dtype=torch.long, device=self.device)
        self.lengths = torch.zeros(rows, dtype=torch.long, device=self.device)  # tokens held per row
        self._arange = torch.arange(4096, device=self.device)

    @property
    def width(self) -> int:
        return self.pos_at.shape[1]

    def _layers(self) -> list[Any]:
        layers = self.cache.layers
        if any(getattr(layer, "is_sliding", False) for layer in layers):
            raise SpecDecError(
                f"batched decoding needs a full-attention KV cache; {type(self.model).__name__} has "
                "sliding-window layers: use --batch-size 1"
            )
        return layers

    def prefill(self, row: int, ids: list[int]) -> None:
        """Make `row` hold exactly `ids` at positions 0..n-1 (its old contents are dropped)."""
        self.pos_at[row] = -1
        self._trim()
        n = len(ids)
        self.lengths[row] = n
        if n == 0:
            return
        single = new_cache(self.model)
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        self.model(input_ids=x, logits_to_keep=1, use_cache=True, **{self.kw: single})
        if self.width < n:
            self._grow_left(n - self.width, single)
        cols = slice(self.width - n, self.width)
        for big, small in zip(self._layers(), single.layers, strict=True):
            big.keys[row, :, cols] = small.keys[0]
            big.values[row, :, cols] = small.values[0]
        self.pos_at[row, cols] = torch.arange(n, device=self.device)

    def _grow_left(self, n: int, like: torch.Tensor) -> None:
        """Prepend n empty columns to every row (the shapes come from a one-row cache `like`)."""
        for big, small in zip(self._layers(), like.layers, strict=True):
            _, heads, _, dim = small.keys.shape
            pad_k = small.keys.new_zeros(self.rows, heads, n, dim)
            pad_v = small.values.new_zeros(self.rows, heads, n, small.values.shape[-1])
            if not big.is_initialized:
                big.lazy_initialization(small.keys, small.values)
                big.keys, big.values = pad_k, pad_v
            else:
                big.keys = torch.cat((pad_k, big.keys), dim=-2)
                big.values = torch.cat((pad_v, big.values), dim=-2)
        empty = torch.full((self.rows, n), -1, dtype=torch.long, device=self.device)
        self.pos_at = torch.cat((empty, self.pos_at), dim=1)

    def forward(self, tokens: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Feed row r's first counts[r] tokens of `tokens` (B, T) after its held ones; the rest of
        each row is padding that nothing attends to. Returns the logits (B, T, vocab)."""
        t = tokens.shape[1]
        steps = self._arange[:t]
        pos = self.lengths[:, None] + steps  # (B, T) position ids
        if self._dense(counts, t):
            # Every row holds exactly the columns 0..W-1 and feeds T real tokens: the model's own
            # causal mask is the right one, and its mask-free attention path is faster.
            keys_pos, mask = torch.cat((self.pos_at, pos), dim=1), None
        else:
            real = steps[None, :] < counts[:, None]
            new_pos = torch.where(real, pos, -1)
            keys_pos = torch.cat((self.pos_at, new_pos), dim=1)  # (B, W + T)
            allowed = (keys_pos[:, None, :] >= 0) & (keys_pos[:, None, :] <= pos[:, :, None])
            # A padding query still needs one key to attend to (its output is never read).
            allowed[:, :, self.width :] |= ~real[:, :, None] & torch.eye(
                t, dtype=torch.bool, device=self.device
            )
            mask = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)
            mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)
            mask = mask[:, None]
        out = self.model(
            input_ids=tokens,
            attention_mask=mask,
            position_ids=pos,
            use_cache=True,
            **{self.kw: self.cache},
        )
        self.pos_at = keys_pos
        self.lengths = self.lengths + counts
        return out.logits

    def _trim(self) -> None:
        """Cut off the columns no row holds at either end (a single row then never has holes)."""
        used = (self.pos_at >= 0).any(0).nonzero()
        first, end = (int(used[0]), int(used[-1]) + 1) if used.numel() else (0, 0)
        if first == 0 and end == self.width:
            return
        for layer in self._layers():
            if layer.is_initialized:
                layer.keys = layer.keys[..., first:end, :]
                layer.values = layer.values[..., first:end, :]
        self.pos_at = self.pos_at[:, first:end]

    def _dense(self, counts: torch.Tensor, t: int) -> bool:
        w = self.width
        return bool((self.lengths == w).all() and (counts == t).all())

    def truncate(self, lengths: torch.Tensor) -> None:
        """Row r keeps its first lengths[r] tokens (every row; pass the current length to keep all)."""
        if torch.equal(lengths, self.lengths):
            return
        self.pos_at = torch.where(self.pos_at >= lengths[:, None], -1, self.pos_at)
        self.lengths = lengths.clone()
        self._trim()
        if self.width > 2 * int(self.lengths.max()) + 64:
            self.compact()

    def compact(self) -> None:
        """Drop the columns no row holds: each row's tokens move right-aligned into the new width."""
        keep = max(1, int(self.lengths.max()))
        # Empty columns (-1) sort first, a row's tokens after them in position order.
        order = torch.argsort(self.pos_at, dim=1, stable=True)[:, -keep:]
        for layer in self._layers():
            if not layer.is_initialized:
                continue
            idx = order[:, None, :, None]
            layer.keys = layer.keys.gather(2, idx.expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3]))
            layer.values = layer.values.gather(
                2, idx.expand(-1, layer.values.shape[1], -1, layer.values.shape[3])
            )
        self.pos_at = self.pos_at.gather(1, order)
