"""A lean decode-only forward for Llama-family draft models, used by the model drafter.

A draft model is small, so a call through transformers' generic forward (mask building, cache
objects, output dataclasses, kwargs plumbing) costs more than its matmuls. This runs the same
weights with a preallocated KV cache and a dozen tensor ops per layer. It serves only to PROPOSE
tokens: the target verifies every one, so its tiny numeric differences cannot change the output.
Models it does not recognise keep transformers' forward.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from ..caches.modes import ExecutionContext

_STATIC_ROPE = ("default", "linear", "llama3", "yarn")


def supports(model: PreTrainedModel) -> bool:
    """Plain Llama decoders: RMSNorm, rotary embeddings of a static kind, SiLU-gated MLP, no biases."""
    cfg = getattr(model, "config", None)
    inner = getattr(model, "model", None)
    if cfg is None or inner is None or getattr(cfg, "model_type", None) != "llama":
        return False
    rotary = getattr(inner, "rotary_emb", None)
    return (
        rotary is not None
        and getattr(rotary, "rope_type", "default") in _STATIC_ROPE
        and not getattr(cfg, "attention_bias", False)
        and not getattr(cfg, "mlp_bias", False)
        and getattr(cfg, "hidden_act", "silu") == "silu"
        and getattr(model, "lm_head", None) is not None
    )


def runs_lean(model: PreTrainedModel, ctx: ExecutionContext, lean: bool = True) -> bool:
    """Whether a draft runs the lean forward: asked for, supported, and not in compiled mode on a
    GPU. There the draft's forward is captured in CUDA graphs like the target's; the lean forward is
    eager and launch-bound (an H200 ran a 1B-shaped draft at 5.15 ms a token lean, 2.10 ms in
    graphs, beside a compiled 8B target at 7 ms). On a CPU the lean forward stays in every mode."""
    graphs = ctx.compiled and next(model.parameters()).device.type == "cuda"
    return lean and not graphs and supports(model)


class LeanLlama:
    """Decode-only forward over a Llama model's weights (shared, not copied) with its own KV cache."""

    def __init__(self, model: PreTrainedModel, capacity: int = 512) -> None:
        cfg = model.config
        inner = model.model
        self.model = model
        self.embed = inner.embed_tokens.weight
        self.norm = inner.norm.weight
        self.head = model.lm_head.weight
        self.eps = float(cfg.rms_norm_eps)
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.layers = [
            (
                layer.input_layernorm.weight,
                layer.self_attn.q_proj.weight,
                layer.self_attn.k_proj.weight,
                layer.self_attn.v_proj.weight,
                layer.self_attn.o_proj.weight,
                layer.post_attention_layernorm.weight,
                layer.mlp.gate_proj.weight,
                layer.mlp.up_proj.weight,
                layer.mlp.down_proj.weight,
            )
            for layer in inner.layers[: cfg.num_hidden_layers]
        ]
        self.device, self.dtype = self.embed.device, self.embed.dtype
        self.length = 0
        self._alloc(capacity)

    def _alloc(self, capacity: int) -> None:
        shape = (len(self.layers), self.n_kv, capacity, self.head_dim)
        old = getattr(self, "k", None)
        k = torch.zeros(shape, device=self.device, dtype=self.dtype)
        v = torch.zeros(shape, device=self.device, dtype=self.dtype)
        if old is not None:
            k[:, :, : self.length] = self.k[:, :, : self.length]
            v[:, :, : self.length] = self.v[:, :, : self.length]
        self.k, self.v = k, v
        # The model's own rotary module makes the tables, so every static RoPE variant is right.
        pos = torch.arange(capacity, device=self.device).unsqueeze(0)
        cos, sin = self.model.model.rotary_emb(self.embed[:1].unsqueeze(0), pos)
        self.cos, self.sin = cos[0].to(self.dtype), sin[0].to(self.dtype)  # (capacity, head_dim)

    def reset(self) -> None:
        self.length = 0

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)

    @staticmethod
    def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits (vocab,) after feeding the 1-D token ids `ids` at the current position."""
        m = ids.numel()
        start, end = self.length, self.length + m
        if end > self.k.shape[2]:
            self._alloc(max(2 * self.k.shape[2], end))
        cos, sin = self.cos[start:end], self.sin[start:end]
        mask = None
        if m > 1:
            mask = (
                torch.arange(end, device=self.device) <= torch.arange(start, end, device=self.device)[:, None]
            )
        x = F.embedding(ids, self.embed)  # (m, hidden)
        nh, nkv, hd, eps = self.n_heads, self.n_kv, self.head_dim, self.eps
        for i, (w_in, wq, wk, wv, wo, w_post, wg, wu, wd) in enumerate(self.layers):
            h = F.rms_norm(x, (x.shape[-1],), w_in, eps)
            q = self._rope(F.linear(h, wq).view(m, nh, hd).transpose(0, 1), cos, sin)
            k = self._rope(F.linear(h, wk).view(m, nkv, hd).transpose(0, 1), cos, sin)
            self.k[i, :, start:end] = k
            self.v[i, :, start:end] = F.linear(h, wv).view(m, nkv, hd).transpose(0, 1)
            keys, values = self.k[i, :, :end], self.v[i, :, :end]
            attn = F.scaled_dot_product_attention(
                q.unsqueeze(0), keys.unsqueeze(0), values.unsqueeze(0), attn_mask=mask, enable_gqa=nkv != nh
            )[0]
            x = x + F.linear(attn.transpose(0, 1).reshape(m, nh * hd), wo)
            h = F.rms_norm(x, (x.shape[-1],), w_post, eps)
            x = x + F.linear(F.silu(F.linear(h, wg)) * F.linear(h, wu), wd)
        self.length = end
        return F.linear(F.rms_norm(x[-1], (x.shape[-1],), self.norm, eps), self.head)


class LeanLlamaRows(LeanLlama):
    """The lean forward for B rows at their own positions: the batched engine's Llama drafts.

    Same interface as `rowcache.RowCache` (`prefill`, `forward`, `truncate`, `lengths`), but the
    cache is preallocated per row, so rollback and refill only move a row's length.
    """

    def __init__(self, model: PreTrainedModel, rows: int, capacity: int = 512) -> None:
        self.rows = rows
        self.lengths = torch.zeros(rows, dtype=torch.long, device=next(model.parameters()).device)
        super().__init__(model, capacity)

    def _alloc(self, capacity: int) -> None:
        shape = (len(self.layers), self.rows, self.n_kv, capacity, self.head_dim)
        old = getattr(self, "k", None)
        k = torch.zeros(shape, device=self.device, dtype=self.dtype)
        v = torch.zeros(shape, device=self.device, dtype=self.dtype)
        if old is not None:
            k[..., : old.shape[3], :] = old
            v[..., : old.shape[3], :] = self.v
        self.k, self.v = k, v
        pos = torch.arange(capacity, device=self.device).unsqueeze(0)
        cos, sin = self.model.model.rotary_emb(self.embed[:1].unsqueeze(0), pos)
        self.cos, self.sin = cos[0].to(self.dtype), sin[0].to(self.dtype)

    def prefill(self, row: int, ids: list[int]) -> None:
        self.lengths[row] = 0
        if ids:
            x = torch.tensor([ids], dtype=torch.long, device=self.device)
            counts = torch.tensor([len(ids)], dtype=torch.long, device=self.device)
            select = torch.tensor([row], dtype=torch.long, device=self.device)
            self.forward(x, counts, logits=False, select=select)

    def truncate(self, lengths: torch.Tensor) -> None:
        self.lengths = lengths.clone()

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,
        counts: torch.Tensor,
        logits: bool = True,
        select: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits (B, T, vocab) after feeding row r's first counts[r] tokens of `tokens` (B, T).

        With `select` (row indices), `tokens` and `counts` hold only those rows: a one-row prefill
        then costs one row's compute, not B rows'.
        """
        b, t = tokens.shape
        rows = select if select is not None else torch.arange(self.rows, device=self.device)
        lengths = self.lengths[rows]
        pos = lengths[:, None] + torch.arange(t, device=self.device)  # (b, T)
        end = int((lengths + counts).max())
        if max(end, int(pos.max()) + 1) > self.k.shape[3]:
            self._alloc(max(2 * self.k.shape[3], end, int(pos.max()) + 1))
        one = b == 1 and int(counts[0]) == t  # one row, every token real: plain slices do
        if one:
            row, start = int(rows[0]), int(lengths[0])
            cos, sin = self.cos[start:end][None, None], self.sin[start:end][None, None]
            # One new token attends to everything before it: no mask (as LeanLlama).
            mask = None if t == 1 else torch.arange(end, device=self.device)[None, :] <= pos[0][:, None]
        else:
            real = torch.arange(t, device=self.device)[None, :] < counts[:, None]
            rows_idx, steps_idx = real.nonzero(as_tuple=True)
            at = pos[rows_idx, steps_idx]
            cache_rows = rows[rows_idx]
            cos, sin = self.cos[pos][:, None], self.sin[pos][:, None]  # (B, 1, T, head_dim)
            mask = torch.arange(end, device=self.device)[None, None, :] <= pos[:, :, None]  # (B, T, end)
        if mask is not None:
            mask = mask[:, None] if mask.dim() == 3 else mask
        x = F.embedding(tokens, self.embed)  # (B, T, hidden)
        nh, nkv, hd, eps = self.n_heads, self.n_kv, self.head_dim, self.eps
        for i, (w_in, wq, wk, wv, wo, w_post, wg, wu, wd) in enumerate(self.layers):
            h = F.rms_norm(x, (x.shape[-1],), w_in, eps)
            q = self._rope(F.linear(h, wq).view(b, t, nh, hd).transpose(1, 2), cos, sin)
            k = self._rope(F.linear(h, wk).view(b, t, nkv, hd).transpose(1, 2), cos, sin)
            v = F.linear(h, wv).view(b, t, nkv, hd).transpose(1, 2)
            if one:
                self.k[i, row, :, start:end] = k[0]
                self.v[i, row, :, start:end] = v[0]
                keys, values = self.k[i, row : row + 1, :, :end], self.v[i, row : row + 1, :, :end]
            else:
                self.k[i, cache_rows, :, at] = k[rows_idx, :, steps_idx]
                self.v[i, cache_rows, :, at] = v[rows_idx, :, steps_idx]
                keys = self.k[i, :, :, :end] if select is None else self.k[i, rows, :, :end]
                values = self.v[i, :, :, :end] if select is None else self.v[i, rows, :, :end]
            attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=nkv != nh)
            x = x + F.linear(attn.transpose(1, 2).reshape(b, t, nh * hd), wo)
            h = F.rms_norm(x, (x.shape[-1],), w_post, eps)
            x = x + F.linear(F.silu(F.linear(h, wg)) * F.linear(h, wu), wd)
        if select is None:
            self.lengths = self.lengths + counts
        else:
            self.lengths = self.lengths.index_add(0, rows, counts)
        if not logits:
            return x
        return F.linear(F.rms_norm(x, (x.shape[-1],), self.norm, eps), self.head)
