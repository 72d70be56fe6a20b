"""The cost model of the per-step gamma policies (runtime/drafting/policies.py): the table the "costmodel"
policy looks its next gamma up in, and predicted speedups of adaptive configs so the search can
seed them. Pure Python, like costmodel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..runtime.drafting.policies import make_policy, with_policy
from .formulas import expected_tokens, expected_tokens_iid, verify_cost_ms

if TYPE_CHECKING:
    from ..domain import Config, Costs
    from ..runtime.drafting.drafters import Drafter
    from ..runtime.drafting.rows import BatchDrafter

ALPHA_STEPS = 100  # the table has one gamma per alpha = 0, 0.01, ..., 1


def _costs_at(costs: Costs, draft: str, batch_size: int) -> tuple[float, float, list[float]] | None:
    """(T_target, T_draft per token, C_ver curve) of `draft` at `batch_size` (B = 1 when the surface
    lacks it); None when the draft was not measured."""
    d = costs.draft(draft)
    if d is None:
        return None
    b = costs.at_batch(batch_size) if batch_size != 1 else None
    if b is not None and draft in b.t_draft_ms:
        return b.t_target_ms, b.t_draft_ms[draft], list(b.verify_ms)
    return costs.t_target_ms, d.t_draft_ms, list(costs.verify_ms)


def gamma_table(costs: Costs, draft: str, gamma_max: int, batch_size: int = 1) -> list[int] | None:
    """For each alpha on the grid, the gamma in 1..gamma_max maximising
    E[tokens](alpha, gamma) / (gamma * T_draft + C_ver(gamma) + step overhead)."""
    at = _costs_at(costs, draft, batch_size)
    if at is None:
        return None
    _, t_draft, verify = at
    step = float(costs.step_overhead_ms or 0.0)
    cost = [g * t_draft + verify_cost_ms(verify, g) + step for g in range(1, gamma_max + 1)]
    table = []
    for i in range(ALPHA_STEPS + 1):
        alpha = i / ALPHA_STEPS
        rates = [expected_tokens_iid(alpha, g) / cost[g - 1] for g in range(1, gamma_max + 1)]
        table.append(1 + max(range(gamma_max), key=lambda j, rates=rates: rates[j]))
    return table


def heuristic_distribution(vector: list[float], gamma_max: int, steps: int = 400) -> list[float]:
    """Stationary share of steps at each gamma = 1..gamma_max under the heuristic (+2 after a fully
    accepted step, -1 otherwise), with position i accepted w.p. vector[i] given 1..i-1 were."""
    full = []
    reach = 1.0
    for i in range(gamma_max):
        reach *= vector[min(i, len(vector) - 1)] if vector else 0.0
        full.append(reach)
    dist = [0.0] * gamma_max
    dist[-1] = 1.0  # it starts at gamma_max
    for _ in range(steps):
        nxt = [0.0] * gamma_max
        for g in range(1, gamma_max + 1):
            p = dist[g - 1]
            if p:
                nxt[min(gamma_max, g + 2) - 1] += p * full[g - 1]
                nxt[max(1, g - 1) - 1] += p * (1.0 - full[g - 1])
        dist = nxt
    return dist


def predict_policy(
    model: Any,
    draft: str,
    gamma_max: int,
    policy: str,
    batch_size: int = 1,  # a costmodel.CostModel
) -> float | None:
    """Predicted speedup of `draft` with `policy` drafting at most `gamma_max` per step."""
    if policy == "fixed":
        return model.predict(draft, gamma_max, batch_size)
    costs = model.costs
    d = costs.draft(draft)
    at = _costs_at(costs, draft, batch_size)
    if d is None or at is None or not d.acceptance_known:
        return None
    t_target, t_draft, verify = at
    if policy == "costmodel":
        table = gamma_table(costs, draft, gamma_max, batch_size) or [gamma_max]
        g = table[round(d.acceptance_rate * (len(table) - 1))]
        return model.predict(draft, g, batch_size)
    # heuristic: a renewal-reward average over the stationary distribution of gamma
    dist = heuristic_distribution(d.acceptance_vector, gamma_max)
    tokens = sum(p * expected_tokens(d.acceptance_vector, g) for g, p in enumerate(dist, 1))
    step = float(costs.step_overhead_ms or 0.0)
    ms = sum(p * (g * t_draft + verify_cost_ms(verify, g) + step) for g, p in enumerate(dist, 1))
    return (t_target + float(costs.loop_overhead_ms or 0.0)) * tokens / ms


def policy_drafter(
    drafter: Drafter | BatchDrafter | None,
    config: Config,
    costs: Costs | None = None,
    batch_size: int | None = None,
) -> Drafter | BatchDrafter | None:
    """`drafter` wrapped in `config`'s gamma policy (itself for "fixed"); the costmodel policy's
    table comes from `costs` (batch 1 when `batch_size` is None)."""
    if config.gamma_policy == "fixed" or drafter is None:
        return drafter
    table, prior = None, 0.5
    d = costs.draft(config.draft.name) if costs is not None else None
    if d is not None:
        table = gamma_table(costs, d.name, config.gamma, batch_size or 1)
        prior = d.acceptance_rate
    return with_policy(drafter, make_policy(config.gamma_policy, config.gamma, table, prior), batch_size)
