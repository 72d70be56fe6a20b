"""The closed-form formulas of speculative decoding (Leviathan et al. 2023): expected tokens per
target forward, the verification cost curve and the predicted speedup. Pure Python; `costmodel`
applies them to measured costs and `policymodel` to the gamma policies.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..errors import SpecDecError
from ..limits import check_gamma


def _check_gamma(gamma: int) -> None:
    check_gamma(gamma)


def _check_probability(value: float, what: str) -> None:
    # `not (0 <= x <= 1)` also rejects NaN.
    if not 0.0 <= value <= 1.0:
        raise SpecDecError(f"{what} must be a probability in [0, 1], got {value!r}")


def expected_tokens_iid(alpha: float, gamma: int) -> float:
    """Expected tokens emitted per target forward with i.i.d. acceptance: (1 - a^(g+1)) / (1 - a)."""
    _check_gamma(gamma)
    _check_probability(alpha, "alpha")
    if 1.0 - alpha < 1e-3:
        # Near a = 1 the closed form loses ~eps/(1 - a) to cancellation; the geometric sum does not,
        # and equals the limit gamma + 1 at a = 1.
        return math.fsum(alpha**k for k in range(gamma + 1))
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def speedup_iid(alpha: float, gamma: int, c: float) -> float:
    """Walltime improvement (1 - a^(g+1)) / ((1 - a)(g*c + 1)), c = T_draft / T_target (Thm 3.8)."""
    if not c >= 0.0:
        raise SpecDecError(f"cost ratio c must be >= 0, got {c!r}")
    return expected_tokens_iid(alpha, gamma) / (gamma * c + 1.0)


def expected_tokens(acceptance_vector: Sequence[float], gamma: int) -> float:
    """Expected tokens per target forward: 1 + sum_{i=1..g} prod_{j<=i} a_j.

    a_j is P(draft token j accepted | tokens 1..j-1 accepted). Positions past the vector's end
    reuse its last value (a profile measured at gamma 4 can still predict gamma 6); an empty
    vector means nothing is ever accepted, so the answer is 1.0.
    """
    _check_gamma(gamma)
    for i, a in enumerate(acceptance_vector):
        _check_probability(a, f"acceptance_vector[{i}]")
    if not acceptance_vector:
        return 1.0
    total = 1.0
    reach = 1.0  # P(tokens 1..i all accepted)
    for i in range(gamma):
        reach *= acceptance_vector[min(i, len(acceptance_vector) - 1)]
        total += reach
    return total


def verify_cost_ms(verify_ms: Sequence[float], gamma: int) -> float:
    """C_ver(gamma): the measured cost of one target forward over gamma + 1 tokens.

    verify_ms[g - 1] is the measurement for gamma = g. Beyond the last measurement we extrapolate
    linearly from the last two points, never below the last measured value (a noisy decreasing
    tail must not predict that verifying more tokens gets cheaper).
    """
    if gamma < 1:
        raise SpecDecError(f"verification cost needs gamma >= 1, got {gamma!r}")
    if not verify_ms:
        raise SpecDecError("no verification costs measured: run `specdec-tune profile` first")
    if gamma <= len(verify_ms):
        return float(verify_ms[gamma - 1])
    last = float(verify_ms[-1])
    slope = last - float(verify_ms[-2]) if len(verify_ms) >= 2 else 0.0
    return last + max(slope, 0.0) * (gamma - len(verify_ms))


def predicted_speedup(
    t_target_ms: float,
    t_draft_ms: float,
    verify_ms: Sequence[float],
    acceptance_vector: Sequence[float],
    gamma: int,
    loop_overhead_ms: float = 0.0,
    step_overhead_ms: float = 0.0,
) -> float:
    """Predicted speedup over plain decoding:

        (T_target + o_loop) * E[tokens] / (g * T_draft + C_ver(g) + o_step)

    o_loop is what a plain decoding loop spends per token besides the forward (sampling, host
    sync, cache bookkeeping); o_step is the same for one speculative step (concatenation,
    verification, cache crop). Both are measured by the profiler; with both 0 and verify_ms all
    equal to t_target_ms this is exactly Leviathan's speedup_iid.
    """
    _check_gamma(gamma)
    if gamma == 0:
        return 1.0
    if not t_target_ms > 0.0 or not t_draft_ms >= 0.0:
        raise SpecDecError(f"costs must be positive (t_target_ms={t_target_ms!r}, t_draft_ms={t_draft_ms!r})")
    if not loop_overhead_ms >= 0.0 or not step_overhead_ms >= 0.0:
        raise SpecDecError(
            f"overheads must be >= 0 (loop_overhead_ms={loop_overhead_ms!r}, step_overhead_ms={step_overhead_ms!r})"
        )
    step_ms = gamma * t_draft_ms + verify_cost_ms(verify_ms, gamma) + step_overhead_ms
    return (t_target_ms + loop_overhead_ms) * expected_tokens(acceptance_vector, gamma) / step_ms
