"""Per-step draft-length policies: how many tokens to draft next, from past steps only.

"fixed" drafts gamma every step. "heuristic" is transformers' `num_assistant_tokens_schedule=
"heuristic"`: +2 after a step whose drafts were all accepted, -1 otherwise, here kept within
[1, gamma]. "costmodel" follows the idea of dynamic speculation lookahead (DISCO, Mamou et al.
2024; SpecDec++, Huang et al. 2024), without their trained per-token classifier: before each step
it estimates the acceptance rate from an exponentially decayed count of past accepted / rejected
draft tokens and looks up the gamma that maximises E[tokens](alpha, gamma) / (gamma * T_draft +
C_ver(gamma)) with the measured costs (a table the search builds, see search/policymodel).
Because the next gamma depends only on accepted lengths of steps already verified, never on the
current step's drafts, every policy keeps the engine exact.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ...domain import GAMMA_POLICIES
from ...errors import SpecDecError
from .rows import BatchDrafter, OneRow, as_rows

if TYPE_CHECKING:
    from .drafters import Drafter


class GammaPolicy:
    """One sequence's policy: `gamma()` for the next step, `update(cap, proposed, accepted)` after."""

    def __init__(self, gamma_max: int) -> None:
        self.gamma_max = gamma_max
        self.reset()

    def reset(self) -> None:
        pass

    def gamma(self) -> int:
        return self.gamma_max

    def update(self, cap: int, proposed: int, accepted: int) -> None:
        pass


class HeuristicGamma(GammaPolicy):
    def reset(self) -> None:
        self.current = self.gamma_max  # HF starts at num_assistant_tokens

    def gamma(self) -> int:
        return self.current

    def update(self, cap: int, proposed: int, accepted: int) -> None:
        # HF compares the matches with num_assistant_tokens, so a step the drafter cut short counts
        # as not fully accepted
        step = 2 if accepted >= cap else -1
        self.current = max(1, min(self.gamma_max, self.current + step))


class CostModelGamma(GammaPolicy):
    """gamma = table[round(alpha * (len(table) - 1))], alpha from decayed success/trial counts."""

    def __init__(self, gamma_max: int, table: Sequence[int], prior_alpha: float, decay: float = 0.8) -> None:
        self.table = [max(1, min(gamma_max, int(g))) for g in table]
        self.prior, self.decay = prior_alpha, decay
        super().__init__(gamma_max)

    def reset(self) -> None:
        self.successes, self.trials = 2.0 * self.prior, 2.0  # two pseudo-observations of the prior

    @property
    def alpha(self) -> float:
        return self.successes / self.trials

    def gamma(self) -> int:
        return self.table[round(self.alpha * (len(self.table) - 1))]

    def update(self, cap: int, proposed: int, accepted: int) -> None:
        # A verified step is `accepted` successes and, if a draft was rejected, one failure: the
        # per-token acceptance of a truncated geometric run.
        failed = 1.0 if accepted < proposed else 0.0
        self.successes = self.decay * self.successes + accepted
        self.trials = self.decay * self.trials + accepted + failed


def make_policy(
    name: str, gamma_max: int, table: Sequence[int] | None = None, prior_alpha: float = 0.5
) -> Callable[[], GammaPolicy]:
    """A factory of per-sequence policies (the batched engine needs one per row)."""
    if name not in GAMMA_POLICIES:
        raise SpecDecError(f"unknown gamma policy '{name}': use {', '.join(GAMMA_POLICIES)}")
    if name == "heuristic":
        return lambda: HeuristicGamma(gamma_max)
    if name == "costmodel":
        if not table:
            raise SpecDecError(
                "the costmodel gamma policy needs the measured costs: run without --no-profile"
            )
        return lambda: CostModelGamma(gamma_max, table, prior_alpha)
    return lambda: GammaPolicy(gamma_max)


class BatchPolicyDrafter(BatchDrafter):
    """A row-keyed drafter whose per-step gamma a policy per row caps (the engine's gamma is the
    maximum): the one policy bookkeeping, batch 1 included (`PolicyDrafter` is its row 0)."""

    def __init__(self, inner: BatchDrafter, make: Callable[[], GammaPolicy], rows: int | None = None) -> None:
        self.inner, self.name = inner, inner.name
        self.rows = rows or inner.rows
        self.device = getattr(inner, "device", "cpu")
        self.policies = [make() for _ in range(self.rows)]
        self._pending: dict[int, tuple[int, int, int]] = {}  # row: (len(seq), cap, proposed k)

    def start(self, row: int, prompt_ids: list[int]) -> None:
        self.inner.start(row, prompt_ids)
        self.policies[row].reset()
        self._pending.pop(row, None)

    def propose(self, seqs, gammas, threshold, temperature, generator):
        caps = {r: min(g, self.policies[r].gamma()) for r, g in gammas.items()}
        out = self.inner.propose(seqs, caps, threshold, temperature, generator)
        for r in seqs:
            self._pending[r] = (len(seqs[r]), caps[r], out[r][0].numel())
        return out

    def commit(self, row: int, valid_len: int) -> None:
        self.inner.commit(row, valid_len)
        pending = self._pending.pop(row, None)
        if pending is not None:
            before, cap, k = pending
            self.policies[row].update(cap, k, valid_len - before)


class PolicyDrafter(OneRow):
    """A batch-1 drafter under a gamma policy: `BatchPolicyDrafter` at row 0."""

    def __init__(self, inner: Drafter, make: Callable[[], GammaPolicy]) -> None:
        super().__init__(BatchPolicyDrafter(as_rows(inner), make, 1), inner.kind)


def with_policy(
    inner: Drafter | BatchDrafter, make: Callable[[], GammaPolicy], rows: int | None = None
) -> PolicyDrafter | BatchPolicyDrafter:
    """`inner` under the gamma policies `make` builds, keyed by rows like `build.build_drafter`: a
    batch-1 `PolicyDrafter` when `rows` is None, else a `BatchPolicyDrafter` for `rows` rows."""
    return PolicyDrafter(inner, make) if rows is None else BatchPolicyDrafter(inner, make, rows)
