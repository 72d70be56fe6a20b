"""backends.vllm.costs without a server: C_ver(γ) from the engine's prefill time after a cached
prefix, and C_ver(B, γ) with B such requests sent together (a fake engine that answers only once
all B are in)."""

from __future__ import annotations

import threading

import pytest

from specdec_tune.backends.vllm.costs import PREFILL_S, batch_costs, verify_curve_ms


class Engine:
    """A vLLM server as the cost pass sees it: /metrics with the block size and a prefill time sum.
    A request with new tokens after the cached `prefix` waits until `rows` of them are in (a
    barrier: sent one by one, they would time out), then prefills in 5 + 2 x tokens x (1 + (rows -
    1) / 4) ms, each: a step over more rows costs more than the rows' share."""

    def __init__(self, prefix: int, rows: int) -> None:
        self.prefix, self.rows = prefix, rows
        self.step = threading.Barrier(rows, timeout=10.0) if rows > 1 else None
        self.lock = threading.Lock()
        self.prefill_s = 0.0
        self.tails: list[tuple[int, ...]] = []

    def call(self, method, path, body, timeout_s=30.0):
        assert (method, path) == ("GET", "/metrics")
        return 200, 'vllm:cache_config_info{block_size="16"} 1.0\n'

    def counters(self):
        with self.lock:
            return {PREFILL_S: self.prefill_s}

    def complete(self, prompt, max_tokens, temperature, seed=0, timeout_s=600.0):
        assert max_tokens == 1 and temperature == 0.0
        new = len(prompt) - self.prefix
        if new > 0:
            if self.step is not None:
                self.step.wait()
            ms = 5.0 + 2.0 * new * (1.0 + (self.rows - 1) / 4.0)
            with self.lock:
                self.prefill_s += ms / 1000.0
                self.tails.append(tuple(prompt[self.prefix :]))
        return {"tokens": [1], "n": 1}


def test_one_row_measures_the_prefill_of_gamma_plus_one_tokens():
    ids = list(range(40))  # a prefix of 32 tokens (two blocks of 16), 8 after it
    curve, worst = verify_curve_ms(Engine(32, 1), ids, 8, repeats=3)
    assert curve == pytest.approx([5.0 + 2.0 * (g + 1) for g in range(1, 9)]) and worst == pytest.approx(
        0.0, abs=1e-9
    )


def test_b_rows_are_sent_together_each_new_and_their_mean_prefill_is_the_curve():
    ids = list(range(40))
    engine = Engine(32, 4)
    at_4 = batch_costs(engine, ids, 4, 8, repeats=3)  # the engine's barrier: all four rows at once
    per_token = 2.0 * (1.0 + 3 / 4.0)
    assert at_4.batch_size == 4 and at_4.t_target_ms == pytest.approx(5.0 + per_token)
    assert at_4.verify_ms == pytest.approx([5.0 + per_token * (g + 1) for g in range(1, 9)])
    # 5 gammas (0, 1, 2, 4, 8) x 3 repeats x 4 rows, no tail sent twice: nothing new is cached
    assert len(engine.tails) == 60 and len(set(engine.tails)) == 60
