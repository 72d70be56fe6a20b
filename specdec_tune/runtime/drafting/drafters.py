"""Drafters propose candidate tokens for the target to verify; none of them touches the target's cache.

Three kinds: a separate draft model (with a confidence-threshold early stop), prompt lookup
(n-gram match in prompt + output, no model), and layer-skip self-speculation (the target's first
k layers with its final norm and LM head). Each keeps its own state between `propose` calls and
is told by `commit` how much of what it saw was accepted.
These drafters work one sequence at a time (`Drafter`); `rows` has the row-keyed interface of the
batched engine and the adapters between the two.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import torch

from ...domain import LOOKUP_MATCHES, THRESHOLD_MODES
from ...errors import SpecDecError
from ..caches.modes import ExecutionContext, SeqCache
from .leandraft import LeanLlama, runs_lean

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class Drafter:
    """Interface: `start` a sequence, `propose` up to gamma tokens, `commit` what was accepted."""

    name: str = "drafter"
    kind: str = "none"

    def start(self, prompt_ids: list[int]) -> None:
        """Forget the previous sequence; the next `propose` sees a new prompt."""

    def propose(
        self,
        seq: list[int],
        gamma: int,
        threshold: float,
        temperature: float,
        generator: torch.Generator | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Up to `gamma` draft token ids (1-D long tensor) following the committed `seq`.

        Returns also the draft distributions q (k x vocab) when sampling from a model, or None
        when q is a point mass on each proposed token (greedy drafting, prompt lookup).
        """
        raise NotImplementedError

    def commit(self, valid_len: int) -> None:
        """The first `valid_len` tokens of seq + proposal are now committed; drop anything beyond."""


class ModelDrafter(Drafter):
    """A causal LM drafting autoregressively with its own KV cache."""

    kind = "model"

    def __init__(
        self,
        model: PreTrainedModel,
        name: str = "draft",
        lean: bool = True,
        threshold_mode: str | None = None,
        ctx: ExecutionContext | None = None,
    ) -> None:
        if threshold_mode not in (None, *THRESHOLD_MODES):
            raise SpecDecError(
                f"unknown threshold mode '{threshold_mode}': use {' or '.join(THRESHOLD_MODES)}"
            )
        self.model = model
        self.name = name
        # "hf": stop after a token whose draft probability is below t (HF's
        # assistant_confidence_threshold); "topk10": llama.cpp's p-min, see `propose`.
        self.threshold_mode = threshold_mode or "hf"
        self.device = next(model.parameters()).device
        self.ctx = ctx or ExecutionContext()  # the engine mode its cache runs under
        self.cache: SeqCache | None = None  # under `ctx`
        self.cached = 0  # tokens of seq (+ proposals) whose keys/values the cache holds
        # Llama-family drafts skip transformers' per-call machinery (leandraft.runs_lean).
        self.lean = LeanLlama(model) if runs_lean(model, self.ctx, lean) else None

    def start(self, prompt_ids: list[int]) -> None:
        if self.lean is not None:
            self.lean.reset()
        else:
            self.cache = self.ctx.seq_cache(self.model)
        self.cached = 0

    def _logits(self, x: torch.Tensor, width: int | None = None) -> torch.Tensor:
        if self.lean is not None:
            return self.lean.forward(x.view(-1))
        return self.cache.forward(x, width)[-1]

    @torch.inference_mode()
    def propose(self, seq, gamma, threshold, temperature, generator):
        # Feed what the draft has not seen yet (the prompt on the first call, then the last
        # accepted tokens and the target's bonus token), then one token per further step.
        if self.cached == 0 and self.lean is None and len(seq) > 1:
            self.cache.prefill(seq[:-1])  # the prompt in one eager forward (its length varies)
            self.cached = len(seq) - 1
        x = torch.tensor([seq[self.cached :]], dtype=torch.long, device=self.device)
        tokens: list[torch.Tensor] = []
        qs: list[torch.Tensor] = []
        fed_last = False  # whether the last proposal was fed to the draft (its cache holds it)
        width = gamma + 1  # a compiled draft catches up in gamma + 1 slots (one graph), then 1
        for _ in range(gamma):
            logits = self._logits(x, width)
            width = None
            fed_last = True
            if threshold > 0.0 and self.threshold_mode == "topk10" and _topk10_confidence(logits) < threshold:
                # llama.cpp's p-min: the unsure token is not proposed. The stop depends on the
                # context only (not on a sampled token), so rejection sampling stays exact.
                break
            fed_last = False
            if temperature == 0.0:
                tok = logits.argmax(-1, keepdim=True)
                if threshold > 0.0:
                    conf = torch.softmax(logits.float(), -1)[tok]
            else:
                q = torch.softmax(logits.float() / temperature, -1)
                tok = torch.multinomial(q, 1, generator=generator)
                qs.append(q)
                conf = q[tok]
            tokens.append(tok)
            # Like HF's assistant_confidence_threshold: the unsure token is still proposed (so
            # rejection sampling stays exact), drafting stops after it.
            if threshold > 0.0 and self.threshold_mode == "hf" and conf.item() < threshold:
                break
            x = tok.view(1, 1)
        # the cache holds seq and every proposal fed back; the last proposal usually was not
        self.cached = len(seq) + len(tokens) - (0 if fed_last else 1)
        if not tokens:
            return torch.empty(0, dtype=torch.long, device=self.device), None
        return torch.cat(tokens), (torch.stack(qs) if qs else None)

    def commit(self, valid_len: int) -> None:
        if self.cached > valid_len:
            if self.lean is not None:
                self.lean.crop(valid_len)
            else:
                self.cache.crop(self.cached - valid_len)
            self.cached = valid_len


def _topk10_confidence(logits: torch.Tensor) -> float:
    """llama.cpp's draft confidence: the top-1 probability of a softmax over the 10 largest logits
    at temperature 1 (its draft sampler is top-k 10 then dist; common/speculative.cpp)."""
    top = logits.float().topk(min(10, logits.shape[-1])).values
    return torch.softmax(top, -1)[0].item()


class PromptLookupDrafter(Drafter):
    """Propose the continuation of an earlier match of the last n tokens (n max..min, longest first).

    `match` picks which earlier occurrence: "latest" (this tool's default; llama.cpp's ngram-simple)
    or "earliest" (HF's prompt lookup and vLLM's ngram proposer). An index maps every n-gram of the
    committed sequence to the latest (or first) position it ended at, so a lookup is O(ngram_max)
    per step instead of a scan over the sequence.
    """

    kind = "prompt_lookup"

    def __init__(
        self,
        ngram_min: int = 1,
        ngram_max: int = 3,
        device: torch.device | str = "cpu",
        name: str = "prompt-lookup",
        match: str | None = None,
    ):
        if not 1 <= ngram_min <= ngram_max:
            raise SpecDecError(
                f"prompt lookup needs 1 <= ngram_min <= ngram_max, got {ngram_min}..{ngram_max}"
            )
        if match not in (None, *LOOKUP_MATCHES):
            raise SpecDecError(f"unknown prompt lookup match '{match}': use {' or '.join(LOOKUP_MATCHES)}")
        self.match = match or "latest"
        self.ngram_min, self.ngram_max = ngram_min, ngram_max
        self.device = torch.device(device)
        self.name = name
        self._empty = torch.empty(0, dtype=torch.long, device=self.device)
        self.start([])

    def start(self, prompt_ids: list[int]) -> None:
        self.index: list[dict[tuple[int, ...], int]] = [{} for _ in range(self.ngram_max + 1)]
        self.indexed = 0  # n-grams ending at positions < indexed are in the index

    def propose(self, seq, gamma, threshold, temperature, generator):
        end = len(seq) - 1  # the suffix ends here; only n-grams ending before it may match
        for j in range(self.indexed, end):
            for n in range(self.ngram_min, min(self.ngram_max, j + 1) + 1):
                key = tuple(seq[j - n + 1 : j + 1])
                if self.match == "latest":
                    self.index[n][key] = j
                else:
                    self.index[n].setdefault(key, j)
        self.indexed = max(self.indexed, end)
        for n in range(min(self.ngram_max, len(seq)), self.ngram_min - 1, -1):
            j = self.index[n].get(tuple(seq[len(seq) - n :]))
            if j is not None:
                cont = seq[j + 1 : j + 1 + gamma]
                return torch.tensor(cont, dtype=torch.long, device=self.device), None
        return self._empty, None


def _decoder_layers_owner(model: PreTrainedModel) -> Any:
    inner = getattr(model, "model", None)
    if inner is not None and isinstance(getattr(inner, "layers", None), torch.nn.ModuleList):
        return inner
    raise SpecDecError(
        f"layer-skip needs a decoder whose layers are at model.model.layers (Llama, Mistral, Qwen, Gemma, "
        f"Phi-3 ...); {type(model).__name__} has none"
    )


def truncated_view(model: PreTrainedModel, layers: int) -> Any:
    """The target's first `layers` decoder layers + its final norm and LM head, sharing weights."""
    inner = _decoder_layers_owner(model)
    total = len(inner.layers)
    if not 1 <= layers < total:
        raise SpecDecError(
            f"layer-skip needs 1 <= layers < {total} (the target has {total} layers), got {layers}"
        )
    cfg = copy.copy(model.config)
    cfg.num_hidden_layers = layers
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = list(cfg.layer_types)[:layers]
    # Shallow copies whose module dicts are new: the view shares every parameter with the target
    # but owns its layer list, so the target itself is never modified.
    new_inner = copy.copy(inner)
    new_inner._modules = dict(inner._modules)
    new_inner.layers = torch.nn.ModuleList(list(inner.layers)[:layers])
    new_inner.config = cfg
    view = copy.copy(model)
    view._modules = dict(model._modules)
    view.model = new_inner
    view.config = cfg
    return view


class LayerSkipDrafter(ModelDrafter):
    """Self-speculation: the target's first k layers draft; they have their own KV cache."""

    kind = "layer_skip"

    def __init__(
        self,
        target: PreTrainedModel,
        layers: int,
        name: str | None = None,
        threshold_mode: str | None = None,
        ctx: ExecutionContext | None = None,
    ) -> None:
        view = truncated_view(target, layers)
        super().__init__(view, name or f"layer-skip-{layers}", threshold_mode=threshold_mode, ctx=ctx)
        self.layers = layers
