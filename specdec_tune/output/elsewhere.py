"""A speedup judged against another machine's reference (docs/ci.md, "On changing runners").

A speedup is the machine's as much as the code's: verifying γ + 1 tokens is matrix-multiply work
where decoding one token is mostly reading weights, so a VM whose cores multiply more slowly moves
the speedup though one-token decode does not slow. On a VM of `cpu-amd-epyc-2t` with AVX2, where the
committed demo profile's reference came from one with AVX-512 (issue 50's account), `profile` found C_ver(7) at 14.47 ms
against 9.47 with T_target 7.77 against 7.40, and quiet checks of the unchanged profile read
0.836-0.856x its stored speedup while their matmul anchor read 0.884-0.912x the reference's
(2026-12-06). So against another machine's reference the floor is scaled by the two machines'
matmul ratio (`machine_floor`): a drop above the scaled floor cannot be told from the machine
(exit 6), and `specdec-tune reference` run with the base revision on this machine would answer; a
drop below it is still a regression. It is a scale, not a model: there the speedup moved a few per
cent further than the anchor, and the tolerance took up the rest.
"""

from __future__ import annotations

from .verdicts import Evidence

ELSEWHERE = (
    "the reference is another machine's, whose speedup need not hold here: `specdec-tune reference` "
    "with the base revision measures one on this machine to judge against"
)
ANSWER = "`specdec-tune reference` with the base revision on this machine"


def machine_floor(e: Evidence, tolerance: float) -> float | None:
    """On another machine than the reference's (`e.same_machine` False): the floor of now/reference
    lowered by as much as the two machines' matmul anchors differ (`e.machine_ratio`, either way),
    below which a drop is a regression whatever the machine; None on the reference's machine, where
    the anchors were not compared, or where they agree.

        tolerance 0.10, matmul here 0.846x the reference's -> 0.761
        tolerance 0.10, matmul here 1.10x                  -> 0.818 (a faster core moves it too)
        the reference's own machine                        -> None"""
    r = e.machine_ratio
    if e.same_machine or r is None or r <= 0:
        return None
    m = min(r, 1 / r)
    return (1 - tolerance) * m if m < 1 else None


def explained_note(e: Evidence, floor: float) -> str:
    """Why a drop against another machine's reference is not a regression."""
    assert e.machine_ratio is not None
    return (
        f"inconclusive: the reference is another machine's, whose matmul anchor this one reads at "
        f"{e.machine_ratio:.3f}x, and that can move a speedup down to {floor:.3f} of it; {ANSWER} would answer"
    )
