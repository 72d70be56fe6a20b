"""vLLM's n-gram drafts replayed at T = 0 (backends.vllm.ngram_sim): the proposer's rule as vLLM's
own function computes it, a replay's bookkeeping, and the engine model predicting an n-gram draft
it never measured from a replay and one measured draft's costs."""

from __future__ import annotations

import json
import os
import random
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from specdec_tune.backends.vllm.args import parse_vllm_draft
from specdec_tune.backends.vllm.ngram_sim import Replayer, as_fit, propose, replay_all
from specdec_tune.domain import Config
from specdec_tune.search.enginemodel import EngineCostModel, Observation


def test_the_longest_suffix_match_at_its_earliest_occurrence_drafts_what_followed_it():
    ctx = [7, 1, 2, 3, 9, 1, 2, 3, 8, 5, 1, 2, 3]
    assert propose(ctx, 1, 3, 4) == [9, 1, 2, 3]  # "1 2 3" first ended at index 3: the earliest wins
    assert propose(ctx, 1, 3, 2) == [9, 1]
    assert propose(ctx, 4, 4, 4) == []  # "5 1 2 3" never came before: no 4-gram match
    assert propose([4, 5, 6, 4, 5], 2, 2, 8) == [6, 4, 5]  # fewer than k tokens after the match
    # the longest match overlaps the suffix and ends one token before it: one token follows it
    assert propose([1, 1, 1, 1], 1, 4, 3) == [1]
    assert propose([3], 1, 2, 3) == []


@dataclass
class Counts:
    predicted_n: int
    predicted_ms: float
    draft_n: int = 0
    draft_accepted: int = 0


def pairs(seed: int = 0, n: int = 4) -> list[tuple[list[int], list[int]]]:
    """Code-edit-like (prompt, reply) pairs: the reply copies the prompt's lines with edits."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        lines = [[rng.randrange(50, 400) for _ in range(rng.randint(4, 9))] for _ in range(6 + i)]
        prompt = [1, 2, 3] + [t for line in lines for t in [*line, 10]]
        reply = []
        for line in lines:
            edited = [rng.randrange(50, 400) if rng.random() < 0.08 * (i + 1) else t for t in line]
            reply += [*edited, 10]
        out.append((prompt, reply[: 30 + 12 * i]))
    return out


def test_a_replay_accounts_for_every_token_and_drafts_no_more_than_gamma():
    for prompt, reply in pairs():
        rp = Replayer(prompt, reply, 2, 4, 64)
        for gamma in (1, 3, 8):
            r = rp.replay(gamma)
            assert r.tokens == len(reply) - 1 == r.forwards + r.kept  # a forward emits 1 + its kept
            assert r.steps <= r.forwards and r.drafted <= gamma * r.steps and r.kept <= r.drafted
    long, short = replay_all(pairs(), 2, 4, 8), replay_all(pairs(), 2, 4, 2)
    assert long.forwards < short.forwards  # longer drafts on copied text: fewer forwards


def test_a_draft_never_measured_is_predicted_from_its_replay_and_another_drafts_costs():
    """One n-gram config measured (its counters and decode times made from the replay and a known
    t, k and o); with the replay the model predicts another window at any γ exactly, without it
    the draft has no prediction at all."""
    data = pairs(seed=3, n=6)
    t, k, o = 40.0, 3.5, 11.0

    def observed(config: Config) -> Observation:
        d = config.draft
        spec, plain = [], []
        for prompt, reply in data:
            r = Replayer(prompt, reply, d.ngram_min, d.ngram_max, 64).replay(config.gamma)
            ms = r.forwards * (t + o) + r.drafted * k
            spec.append(Counts(r.tokens + 1, ms, r.drafted, r.kept))
            plain.append(Counts(r.tokens + 1, r.tokens * t))
        return Observation(config, spec, plain)

    def truth(config: Config) -> float:
        d = config.draft
        r = replay_all(data, d.ngram_min, d.ngram_max, config.gamma)
        return r.tokens * t / (r.forwards * (t + o) + r.drafted * k)

    measured = Config(parse_vllm_draft("ngram:4"), 5)
    other = parse_vllm_draft("ngram:2-4")
    bare = EngineCostModel([observed(measured)], forward_overhead=True)
    assert bare.predict(Config(other, 8)) is None

    def simulate(config: Config):
        d = config.draft
        return as_fit(replay_all(data, d.ngram_min, d.ngram_max, config.gamma), d.name, config.gamma)

    model = EngineCostModel([observed(measured)], forward_overhead=True)
    model.simulate = simulate
    for gamma in (1, 3, 5, 8):
        assert model.predict(Config(other, gamma)) == pytest.approx(truth(Config(other, gamma)), rel=1e-6)
    assert model.predict(measured) == pytest.approx(truth(measured), rel=1e-6)
    assert "replayed at T = 0" in model.explain(Config(other, 8))
    best = model.rank([Config(other, g) for g in range(1, 9)])[0][0]
    assert best.gamma == max(range(1, 9), key=lambda g: truth(Config(other, g)))


VLLM_PYTHON = os.environ.get("SPECDEC_VLLM_PYTHON")
CROSS = """
import json, random, sys
import numpy as np
from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens as f
random.seed(7)
out = []
for _ in range(300):
    t = [random.randrange(random.choice([2, 3, 5, 20])) for _ in range(random.randint(1, 60))]
    lo = random.randint(1, 4); hi = random.randint(lo, 6); k = random.randint(1, 8)
    out.append([t, lo, hi, k, f(np.array(t, dtype=np.int32), lo, hi, 4096, k).tolist()])
print(json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.skipif(
    not VLLM_PYTHON or not Path(VLLM_PYTHON).is_file(), reason="vLLM is absent: set SPECDEC_VLLM_PYTHON"
)
def test_the_replayed_proposer_drafts_what_vllms_own_proposer_drafts():
    """300 random token sequences (small vocabularies: many ties and overlaps) through vLLM's own
    `_find_longest_matched_ngram_and_propose_tokens` and through `propose`."""
    done = subprocess.run([VLLM_PYTHON, "-c", CROSS], capture_output=True, text=True, timeout=300, check=True)
    cases = json.loads(done.stdout.strip().splitlines()[-1])
    differ = [c for c in cases if propose(c[0], c[1], c[2], c[3]) != c[4]]
    assert len(cases) == 300 and not differ, differ[:3]
