"""Batched speculative decoding under closed-loop load: B requests in flight at all times.

Each step every active row's drafter proposes up to gamma tokens (a draft model runs one batched
forward per draft position, prompt lookup works per row, layer-skip is a batched model draft),
the target verifies all rows' [last, d1..dk] in ONE forward over a `RowCache`, and each row keeps
its own accepted length: greedy takes the longest prefix equal to the target's argmax, sampling
uses rejection sampling per row (`decode.accept_greedy` and `decode.verify_sampling`, the batch-1
loop's own). A row that finishes (EOS or its budget) is refilled at once with the next prompt of
the queue. gamma 0 is plain batched decoding with the same cache and refill: the baseline at the
same batch size. A batch-size schedule (`gamma_by_rows`) changes gamma from step to step with the
rows in flight, 0 (a plain step) included. The drafters are row-keyed (`drafting.rows.BatchDrafter`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ..errors import SpecDecError
from ..limits import check_count, check_decoding
from .caches.modes import ExecutionContext
from .decode import SpecStats, accept_greedy, append_tokens, verify_sampling
from .drafting.leandraft import LeanLlamaRows, runs_lean
from .drafting.rows import BatchDrafter
from .workloads import Case

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from .caches.rowcache import RowCache
    from .caches.slots import SlotCache


class BatchModelDrafter(BatchDrafter):
    """A causal LM drafting for all rows at once: one batched forward per draft position."""

    def __init__(
        self,
        model: PreTrainedModel,
        rows: int,
        name: str = "draft",
        lean: bool = True,
        threshold_mode: str | None = None,
        ctx: ExecutionContext | None = None,
    ) -> None:
        ctx = ctx or ExecutionContext()
        # Llama-family drafts skip transformers' per-call machinery (leandraft.runs_lean).
        self.kv = LeanLlamaRows(model, rows) if runs_lean(model, ctx, lean) else ctx.row_kv(model, rows)
        self.name, self.rows, self.device = name, rows, self.kv.device
        # "hf": the unsure token is proposed, drafting stops after it; "topk10": llama.cpp's p-min,
        # the unsure token is not proposed (see drafters.ModelDrafter).
        self.threshold_mode = threshold_mode or "hf"

    def start(self, row: int, prompt_ids: list[int]) -> None:
        self.kv.prefill(row, prompt_ids[:-1])

    @torch.inference_mode()
    def propose(self, seqs, gammas, threshold, temperature, generator):
        kv = self.kv
        rows = [r for r in seqs if gammas[r] > 0]
        toks: dict[int, list[int]] = {r: [] for r in seqs}
        qs: dict[int, list[torch.Tensor]] = {r: [] for r in seqs}
        if rows:
            # First forward: what each row's draft has not seen yet (accepted tokens, the bonus).
            lengths = kv.lengths.tolist()
            unseen = {r: seqs[r][lengths[r] :] for r in rows}
            width = max(len(u) for u in unseen.values())
            if getattr(kv, "compiled", False):  # one graph for the catch-up: gamma + 1 slots
                width = max(width, max(gammas.values()) + 1)
            rows_in = [[0] * width for _ in range(kv.rows)]
            sizes = [0] * kv.rows
            for r, u in unseen.items():
                rows_in[r][: len(u)] = u
                sizes[r] = len(u)
            counts = torch.tensor(sizes, dtype=torch.long, device=kv.device)
            logits = kv.forward(torch.tensor(rows_in, dtype=torch.long, device=kv.device), counts)
            last = logits[torch.arange(kv.rows, device=kv.device), (counts - 1).clamp_min(0)]
            self._draft(rows, gammas, last, threshold, temperature, generator, toks, qs)
        return {
            r: (
                torch.tensor(toks[r], dtype=torch.long, device=kv.device),
                torch.stack(qs[r]) if qs[r] else None,
            )
            for r in seqs
        }

    def _draft(self, running, gammas, last, threshold, temperature, generator, toks, qs) -> None:
        """One draft token per running row per batched forward, until each row's gamma or stop."""
        kv = self.kv
        topk10 = threshold > 0.0 and self.threshold_mode == "topk10"
        for step in range(max(gammas[r] for r in running)):
            if topk10:
                top = last.float().topk(min(10, last.shape[-1]), dim=-1).values
                sure = (torch.softmax(top, -1)[:, 0] >= threshold).tolist()
                running = [r for r in running if sure[r]]
                if not running:
                    break
            if temperature == 0.0:
                picked = last.argmax(-1)
                probs = torch.softmax(last.float(), -1) if threshold > 0.0 else None
            else:
                probs = torch.softmax(last.float() / temperature, -1)
                picked = torch.multinomial(probs, 1, generator=generator).view(-1)
            picked_list = picked.tolist()
            # HF semantics: the unsure token is still proposed, drafting stops after it.
            hf_stop = not topk10 and probs is not None and threshold > 0.0
            conf = probs.gather(1, picked.view(-1, 1)).view(-1).tolist() if hf_stop else None
            still = []
            for r in running:
                toks[r].append(picked_list[r])
                if temperature > 0.0:
                    qs[r].append(probs[r])
                if step + 1 < gammas[r] and not (hf_stop and conf[r] < threshold):
                    still.append(r)
            running = still
            if not running:
                break
            counts = torch.zeros(kv.rows, dtype=torch.long, device=kv.device)
            counts[running] = 1
            last = kv.forward(picked.view(-1, 1), counts)[:, 0]

    def commit(self, row: int, valid_len: int) -> None:
        if int(self.kv.lengths[row]) > valid_len:
            lengths = self.kv.lengths.clone()
            lengths[row] = valid_len
            self.kv.truncate(lengths)


@dataclass
class BatchRun:
    """One closed-loop pass over a workload at batch size B."""

    outputs: list[list[int]]  # new tokens per prompt, in the workload's order
    stats: SpecStats
    latencies_s: list[float] = field(default_factory=list)  # per prompt: admission to last token
    steps: int = 0  # batched target forwards (prefills excluded)
    # Steady state: from the first step until a slot first went idle for lack of requests (the
    # queue ran dry), every one of the B slots was busy. Tokens emitted and seconds in that window.
    steady_tokens: int = 0
    steady_s: float = 0.0
    # Per batched step: (rows in flight, the step's gamma, draft tokens proposed, accepted).
    per_step: list[tuple[int, int, int, int]] = field(default_factory=list)

    @property
    def steady_tokens_per_s(self) -> float:
        """Throughput with B requests in flight (the whole run's when it never drained)."""
        return self.steady_tokens / self.steady_s if self.steady_s > 0 else float("nan")


@dataclass
class _Row:
    index: int  # the prompt's place in the workload
    seq: list[int]  # committed tokens; the last one is not in the target's cache yet
    out: list[int]
    budget: int
    started: float
    steps: list[tuple[int, int, int]] = field(default_factory=list)  # (allowed g, proposed k, accepted n)


def schedule_of(gamma_by_rows: Mapping[int, int] | None, gamma: int) -> dict[int, int]:
    """A batch-size schedule inside a run (vLLM's `num_speculative_tokens_per_batch_size`,
    TensorRT-LLM's `draft_len_schedule`): a step with n rows in flight drafts at most
    `gamma_by_rows.get(n, gamma)` tokens a row, 0 being a plain step. `gamma` stays the most any
    step drafts (the caches and a compiled engine's widths are sized for it); a draft model catches
    up on the tokens of plain steps at the next step that drafts."""
    schedule = dict(gamma_by_rows or {})
    if any(not 0 <= g <= gamma for g in schedule.values()):
        raise SpecDecError(f"a batch-size schedule's gamma must be in 0..{gamma} (the run's gamma)")
    return schedule


@torch.inference_mode()
def batch_generate(
    target: PreTrainedModel,
    drafter: BatchDrafter | None,
    case: Case,
    batch_size: int,
    gamma: int,
    threshold: float = 0.0,
    seed: int = 0,
    ctx: ExecutionContext | None = None,
    gamma_by_rows: Mapping[int, int] | None = None,
) -> BatchRun:
    """Decode every prompt of `case` with `batch_size` requests in flight (refilled from the queue),
    the target's cache built under `ctx` (default: eager). `gamma_by_rows`: see `schedule_of`."""
    ctx = ctx or ExecutionContext()
    check_count(batch_size, "batch size")
    check_decoding(gamma, threshold, case.temperature, min(case.max_new_tokens))
    schedule = schedule_of(gamma_by_rows, gamma)
    if any(not p for p in case.prompts):
        raise SpecDecError("the prompt is empty: nothing to condition on")
    temperature = case.temperature
    device = next(target.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed) if temperature > 0 else None
    eos = set(case.eos)
    speculate = drafter is not None and gamma > 0
    longest = max(len(p) + b for p, b in zip(case.prompts, case.max_new_tokens, strict=True))
    kv = ctx.row_kv(target, batch_size, longest + gamma + 2)
    # A compiled engine verifies gamma + 1 slots in every step: one graph per (B, gamma).
    fixed_width = gamma + 1 if speculate and ctx.compiled else 0
    slots = _Slots(case, kv, drafter if speculate else None, batch_size)
    steps = 0
    per_step: list[tuple[int, int, int, int]] = []
    started = time.perf_counter()
    full = len(case.prompts) >= batch_size  # fewer requests than slots: never a steady state
    emitted = 0
    steady: tuple[int, float] | None = None  # (tokens, seconds) when a slot first went idle
    while any(slots.rows):
        active = {r: row for r, row in enumerate(slots.rows) if row is not None}
        g = schedule.get(len(active), gamma)
        # Never draft past a row's budget: k drafts emit at most k + 1 tokens.
        allowed = {r: max(0, min(g, row.budget - len(row.out) - 1)) for r, row in active.items()}
        drafts: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}
        if speculate:
            drafts = drafter.propose(
                {r: row.seq for r, row in active.items()}, allowed, threshold, temperature, generator
            )
        proposed = {r: d.tolist() for r, (d, _) in drafts.items()}
        tokens, sizes = _step_input(active, proposed, fixed_width, batch_size, device)
        held = kv.lengths.tolist()  # each row's length before this step
        logits = kv.forward(tokens, torch.tensor(sizes, dtype=torch.long, device=device))
        steps += 1
        if temperature == 0.0:
            greedy = accept_greedy(logits, [proposed.get(r, []) for r in range(batch_size)])
        keep = list(held)
        for r, row in active.items():
            k = sizes[r] - 1
            if temperature == 0.0:
                n, new = greedy[r]
            else:
                draft, q = drafts[r] if speculate else (tokens[r, 1:1], None)
                n, new = verify_sampling(logits[r, : k + 1], draft, q, temperature, generator)
            row.steps.append((allowed[r], k, n))
            keep[r] = held[r] + n + 1  # last + the accepted drafts; the new last token is not cached
            emitted += slots.accept(r, row, n, new, eos)
        _truncate(kv, keep, slots.rows, device)
        accepted = sum(row.steps[-1][2] for row in active.values())
        per_step.append((len(active), g, sum(map(len, proposed.values())), accepted))
        if steady is None and full and not all(slots.rows) and any(slots.rows):
            steady = (emitted, time.perf_counter() - started)
    if steady is None or steady[0] == 0:
        steady = (emitted, time.perf_counter() - started)
    return BatchRun(slots.outputs, slots.stats, slots.latencies, steps, *steady, per_step=per_step)


class _Slots:
    """The B slots of the closed loop: a request admitted from the queue into a free slot (its
    prompt prefilled, the drafter started on it), its accepted tokens appended, and when it is done
    its output kept and the slot refilled."""

    def __init__(
        self, case: Case, kv: RowCache | SlotCache, drafter: BatchDrafter | None, batch_size: int
    ) -> None:
        self.case, self.kv, self.drafter = case, kv, drafter
        self.queue = deque(range(len(case.prompts)))
        self.rows: list[_Row | None] = [None] * batch_size
        self.outputs: list[list[int]] = [[] for _ in case.prompts]
        self.latencies = [0.0] * len(case.prompts)
        self.stats = SpecStats()
        for r in range(min(batch_size, len(self.queue))):
            self.admit(r)

    def admit(self, r: int) -> None:
        i = self.queue.popleft()
        prompt = self.case.prompts[i]
        self.kv.prefill(r, prompt[:-1])
        if self.drafter is not None:
            self.drafter.start(r, prompt)
        self.rows[r] = _Row(i, list(prompt), [], self.case.max_new_tokens[i], time.perf_counter())

    def accept(self, r: int, row: _Row, n: int, new: list[int], eos: set[int]) -> int:
        """Row r's new tokens (n drafts accepted) appended; returns how many it emitted. A finished
        request leaves its slot to the next; the drafter of a running one rolls back to what holds."""
        emitted_before = len(row.out)
        before = len(row.seq)
        done = append_tokens(row.out, new, eos, row.budget)
        row.seq.extend(new)
        emitted = len(row.out) - emitted_before
        if done:
            self._finish(r, row)
        elif self.drafter is not None:
            self.drafter.commit(r, before + n)
        return emitted

    def _finish(self, r: int, row: _Row) -> None:
        self.outputs[row.index] = row.out
        self.latencies[row.index] = time.perf_counter() - row.started
        self.stats.add(SpecStats.from_steps(row.steps, len(row.steps), len(row.out)))
        self.rows[r] = None
        if self.queue:
            self.admit(r)


def _step_input(
    active: dict[int, _Row],
    proposed: dict[int, list[int]],
    fixed_width: int,
    batch_size: int,
    device: torch.device,
) -> tuple[torch.Tensor, list[int]]:
    """A step's input: each row's last token and its drafts, padded to one width, and each row's
    count. Built in Python and sent once: per-row tensor writes cost more than the rows' whole
    bookkeeping."""
    width = max(fixed_width, 1 + max(map(len, proposed.values()), default=0))
    rows_in = [[0] * width for _ in range(batch_size)]
    sizes = [0] * batch_size
    for r, row in active.items():
        d = proposed.get(r, [])
        rows_in[r][0] = row.seq[-1]
        rows_in[r][1 : 1 + len(d)] = d
        sizes[r] = len(d) + 1
    return torch.tensor(rows_in, dtype=torch.long, device=device), sizes


def _truncate(
    kv: RowCache | SlotCache, keep: list[int], rows: list[_Row | None], device: torch.device
) -> None:
    """Each row's cache cut to what it holds; refilled rows were prefilled after the step's lengths
    were read: their fresh length is left alone."""
    lengths = kv.lengths.tolist()
    for r, row in enumerate(rows):
        if row is None or not row.out:
            keep[r] = lengths[r]
    kv.truncate(torch.tensor(keep, dtype=torch.long, device=device))
