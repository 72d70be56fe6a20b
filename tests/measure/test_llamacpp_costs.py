"""measure.llamacpp.costs without a server: C_ver(γ) from prompt processing after a cached prefix,
measured at every γ or, at a carried context length, at a few and interpolated."""

from __future__ import annotations

import pytest

from specdec_tune.measure.llamacpp.costs import verify_curve_ms


class Server:
    """Answers /completion as llama-server's timings would: a prompt longer than the cached prefix
    processes its new tokens at 2 ms each plus 5 ms; it records which lengths it was sent."""

    def __init__(self, prefix: int) -> None:
        self.prefix, self.sent = prefix, []

    def post(self, path: str, body: dict) -> dict:
        new = len(body["prompt"]) - self.prefix
        self.sent.append(new)
        n = max(1, new)
        return {"timings": {"prompt_n": n, "prompt_ms": 5.0 + 2.0 * n}}


def test_every_gamma_is_measured_or_a_few_and_the_rest_interpolated():
    ids = list(range(100))
    full = Server(100)
    curve, worst = verify_curve_ms(full, ids, 8, repeats=2)
    assert curve == pytest.approx([5.0 + 2.0 * (g + 1) for g in range(1, 9)]) and worst == 0.0
    assert sorted({n for n in full.sent if n > 0}) == [g + 1 for g in range(1, 9)]
    sparse = Server(100)
    curve2, _ = verify_curve_ms(sparse, ids, 8, repeats=2, gammas=[2, 4])
    assert sorted({n for n in sparse.sent if n > 0}) == [2, 3, 5, 9]  # γ = 1, 2, 4 and max 8
    assert curve2 == pytest.approx(curve)  # linear here, so interpolation is exact
    assert len(sparse.sent) < len(full.sent) / 1.9
