"""Closed-form predictions of speculative-decoding speedup from measured costs x acceptance.

`CostModel(costs).predict(...)` applies the formulas of `formulas` (Leviathan et al. 2023) to a
profile's costs, and `policymodel`'s to the gamma policies; pure Python, no torch, so the tuner can seed its search and `show` can explain a profile
without loading a model.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

from ..domain import Costs, DraftCosts
from ..errors import SpecDecError
from ..limits import check_gamma
from .formulas import expected_tokens, predicted_speedup, verify_cost_ms
from .loopterms import budget_steps, budget_tokens_per_step, loop_verify_growth
from .policymodel import predict_policy


def in_loop(costs: Costs, d: DraftCosts) -> tuple[float, list[float]]:
    """T_draft and the C_ver curve as the real loop sees them (batch size 1).

    The micro-benchmarks time one model hot; in the loop the draft and the target evict each
    other's weights from the caches. Where the acceptance pass clocked both inside the loop, the
    draft's in-loop ms per token replaces T_draft, and the C_ver curve is scaled by the in-loop
    verification time over the micro-benchmark's at the same width.
    """
    t_draft = d.loop_t_draft_ms if d.loop_t_draft_ms else d.t_draft_ms
    verify = list(costs.verify_ms)
    if d.loop_verify_ms and d.loop_verify_tokens and verify:
        gamma = max(1, round(d.loop_verify_tokens - 1))
        micro = verify_cost_ms(verify, gamma)
        if micro > 0:
            scale = d.loop_verify_ms / micro
            verify = [v * scale for v in verify]
    return t_draft, verify


class CostModel:
    """Predictions for one set of measured `Costs`: `predict(draft, gamma)`, the best gamma per
    draft, and every config ranked. Drafts are named as in `costs.drafts`."""

    def __init__(self, costs: Costs, budgets: Sequence[int] | None = None) -> None:
        """`budgets`: the workload's per-request token budgets; with them the prediction counts
        the budget cut (no drafting past a request's end, `loopterms.budget_steps`)."""
        self.costs = costs
        self.budgets = [int(n) for n in budgets or [] if int(n) > 0]
        self.loop_overhead_ms = float(costs.loop_overhead_ms or 0.0)
        self.step_overhead_ms = float(costs.step_overhead_ms or 0.0)

    @property
    def drafts(self) -> list[str]:
        return [d.name for d in self.costs.drafts]

    def predict(self, draft: str, gamma: int, batch_size: int = 1, policy: str = "fixed") -> float | None:
        """Predicted speedup of `draft` at `gamma` with `batch_size` requests in flight (1.0 at
        gamma 0; None for a draft or batch size that was not measured, or whose acceptance is
        unknown).

        At B > 1 the same formula takes the costs of the surface at B: a step verifies B rows at
        once, every row gains E[tokens], so the throughput ratio is the per-row one. A gamma policy
        other than "fixed" (gamma its maximum) is predicted by `policymodel`.
        """
        if gamma == 0:
            return 1.0
        if policy != "fixed":
            return predict_policy(self, draft, gamma, policy, batch_size)
        d = self.costs.draft(draft)
        if d is None or not d.acceptance_known:
            return None
        c = self.costs
        t_target, t_draft, verify = c.t_target_ms, d.t_draft_ms, c.verify_ms
        o_loop, o_step = self.loop_overhead_ms, self.step_overhead_ms
        if batch_size == 1:
            t_draft, verify = in_loop(c, d)
            if self.budgets:
                return self._budgeted_b1(
                    d.acceptance_vector, gamma, t_target, t_draft, verify, o_loop, o_step
                )
        else:
            b = c.at_batch(batch_size)
            if b is None or draft not in b.t_draft_ms:
                return None
            t_target, t_draft, verify = b.t_target_ms, b.t_draft_ms[draft], list(b.verify_ms)
            # Clocked inside real batched loops where the surface has them (see BatchCosts).
            t_draft = b.loop_t_draft_ms.get(draft, t_draft)
            if b.loop_overhead_ms is not None:
                o_loop = b.loop_overhead_ms
            o_step = b.step_overhead_ms.get(draft, o_step)
            if draft in b.loop_verify_ms and verify:
                width = max(1, round(b.loop_verify_tokens[draft] - 1))  # per row: [last, drafts]
                micro = verify_cost_ms(verify, width)
                if micro > 0:
                    verify = [v * b.loop_verify_ms[draft] / micro for v in verify]
                    # The in-loop ratio grows with gamma around the width it was clocked at.
                    verify = [v * loop_verify_growth(g, width) for g, v in enumerate(verify, 1)]
        speedup = predicted_speedup(t_target, t_draft, verify, d.acceptance_vector, gamma, o_loop, o_step)
        if self.budgets:
            # Every step costs the widest row's width; the cut only lowers tokens per step.
            free = expected_tokens(d.acceptance_vector, gamma)
            speedup *= budget_tokens_per_step(d.acceptance_vector, gamma, self.budgets) / free
        return speedup

    def _budgeted_b1(
        self,
        vector: Sequence[float],
        gamma: int,
        t_target: float,
        t_draft: float,
        verify: list[float],
        o_loop: float,
        o_step: float,
    ) -> float:
        """Batch size 1 with the budget cut: a step drafting g < gamma near a request's end emits
        fewer tokens and costs less (g drafts, C_ver(g))."""

        def step_ms(g: int) -> float:
            return g * t_draft + (verify_cost_ms(verify, g) if g > 0 else t_target) + o_step

        total = sum(budget_steps(vector, gamma, n, step_ms)[1] for n in self.budgets)
        return (t_target + o_loop) * sum(self.budgets) / total

    def ceiling(self, draft: str, gamma: int, batch_size: int = 1, policy: str = "fixed") -> float | None:
        """The most `draft` at `gamma` can reach here: the prediction with every draft token
        accepted (gamma + 1 tokens per step); a policy may draft fewer, so it gets the best such
        bound at any gamma up to its maximum. None where nothing is predicted."""
        d = self.costs.draft(draft)
        if d is None or gamma < 1:
            return None
        bounds = []
        for g in range(1, gamma + 1) if policy != "fixed" else (gamma,):
            predicted = self.predict(draft, g, batch_size)
            tokens = expected_tokens(d.acceptance_vector, g) if predicted is not None else 0.0
            if tokens > 0:
                bounds.append(predicted * (g + 1) / tokens)
        return max(bounds, default=None)

    def curve(self, draft: str, max_gamma: int | None = None, batch_size: int = 1) -> list[tuple[int, float]]:
        """(gamma, predicted speedup) for gamma = 1..max_gamma; by default up to the shorter of the
        measured verify curve and acceptance vector (no extrapolation)."""
        d = self.costs.draft(draft)
        if d is None or (batch_size != 1 and self.costs.at_batch(batch_size) is None):
            return []
        if max_gamma is None:
            max_gamma = min(len(self.costs.verify_ms), len(d.acceptance_vector))
        check_gamma(max_gamma)
        points = [(g, self.predict(draft, g, batch_size)) for g in range(1, max_gamma + 1)]
        return [(g, v) for g, v in points if v is not None]

    def best_gamma(self, draft: str, max_gamma: int, batch_size: int = 1) -> tuple[int, float]:
        """The gamma in 1..max_gamma with the highest predicted speedup, and that speedup.

        (0, 1.0) -- "don't speculate" -- when no gamma beats plain decoding. Ties go to the smaller
        gamma (less draft work, less memory).
        """
        best = (0, 1.0)
        for gamma, speedup in self.curve(draft, max_gamma, batch_size):
            if speedup > best[1]:
                best = (gamma, speedup)
        return best

    def rank(
        self, max_gamma: int, drafts: list[str] | None = None, batch_size: int = 1
    ) -> list[tuple[str, int, float]]:
        """Every (draft, gamma, predicted speedup) for gamma in 1..max_gamma, best first.

        The plain baseline (1.0) is not listed. Ties break by draft name, then smaller gamma.
        """
        names = [n for n in self.drafts if drafts is None or n in drafts]
        ranked = [(name, g, v) for name in names for g, v in self.curve(name, max_gamma, batch_size)]
        ranked.sort(key=lambda row: (-row[2], row[0], row[1]))
        return ranked

    def b_star(self, max_gamma: int) -> int | None:
        """The smallest profiled batch size at which no config is predicted to beat plain decoding."""
        for b in sorted(x.batch_size for x in self.costs.batch):
            ranked = self.rank(max_gamma, batch_size=b)
            if ranked and ranked[0][2] <= 1.0:
                return b
        return None


def _conditional_rates(proposed_at: Sequence[int], accepted_at: Sequence[int]) -> list[float]:
    rates: list[float] = []
    for i, (proposed, accepted) in enumerate(zip(proposed_at, accepted_at, strict=True)):
        if proposed < 0 or accepted < 0 or accepted > proposed:
            raise SpecDecError(
                f"position {i + 1}: accepted ({accepted}) must be between 0 and proposed ({proposed})"
            )
        if proposed == 0:
            # Never reached: no evidence. Reusing the previous rate keeps the vector NaN-free and
            # matches expected_tokens' "past the end, reuse the last value" rule; with no previous
            # rate, 0.0 is the pessimistic choice (predicts no gain from that position).
            rates.append(rates[-1] if rates else 0.0)
        else:
            rates.append(accepted / proposed)
    return rates


def acceptance_vector_from_position_counts(
    proposed_at: Sequence[int], accepted_at: Sequence[int]
) -> list[float]:
    """Per-position conditional acceptance accepted_at[i] / proposed_at[i] (position i + 1).

    These are the engine's counters. Positions never proposed reuse the previous rate (0.0 for the
    first position), so the vector never holds NaN.
    """
    if len(proposed_at) != len(accepted_at):
        raise SpecDecError(
            f"proposed_at has {len(proposed_at)} positions but accepted_at has {len(accepted_at)}"
        )
    return _conditional_rates(proposed_at, accepted_at)


def acceptance_vector_from_counts(accept_lengths: Sequence[int], gamma: int) -> list[float]:
    """Per-position conditional acceptance from the accepted length of each verification step.

    Every step proposed gamma tokens and accepted the first n of them (0 <= n <= gamma), so
    position i was proposed in the steps with n >= i - 1 and accepted in those with n >= i.
    Positions never reached reuse the previous rate (0.0 for the first), so the result is NaN-free.
    """
    check_gamma(gamma)
    histogram = [0] * (gamma + 1)
    for n in accept_lengths:
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or not 0 <= n <= gamma:
            raise SpecDecError(f"accepted length must be an integer in 0..{gamma}, got {n!r}")
        histogram[n] += 1
    # at_least[k] = number of steps that accepted >= k tokens
    at_least = [0] * (gamma + 2)
    for k in range(gamma, -1, -1):
        at_least[k] = at_least[k + 1] + histogram[k]
    proposed_at = [at_least[i - 1] for i in range(1, gamma + 1)]
    accepted_at = [at_least[i] for i in range(1, gamma + 1)]
    return _conditional_rates(proposed_at, accepted_at)
