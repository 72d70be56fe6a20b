"""Speculative sampling is exact: the tokens it emits follow the target's own distribution.

Each test draws N = 8,000 seeded generations and runs a χ² goodness-of-fit test of the joint of
their first 3 tokens against the target's exact joint, computed from softmax(logits / T) with a
handful of forwards; cells expected below 5 are pooled. A correct sampler must give a p-value
> 1e-3 (a false alarm once in 1,000 runs, were the seeds not fixed); the power check plants the
classic verifier bug and requires p < 1e-6, so the test can fail.

Power at N = 8,000 (`benchmarks/sampling_power.py`, with these seeds): the classic bug adds 0.23 to χ²
per sample (χ² 4,822 on 204 degrees of freedom at 20,000; 1,483 on 143 at 6,000, p 3e-221), 0.10
through the hybrid drafter (p 9e-61 at 6,000). A correct sampler scored p 0.10 and 0.22. A bug
adds about 110 to χ² at 80 % power against the 1e-3 line, so these tests still catch a bias
about 1/17 the size of the classic one (1/40 at 20,000, for 2.5x the time).

max_new_tokens is 3 because the engine never drafts past max_new_tokens - 1: with 2 it would
propose a single token, and position 2 of the verifier would go untested. The forward passes are
memoised (see `Memoized`) so that thousands of runs of the real loop take seconds, not minutes.
"""

from __future__ import annotations

import inspect
import math
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from helpers import noisy_copy, tiny_llama

from specdec_tune.runtime import decode as engine
from specdec_tune.runtime.decode import SpecStats, autoregressive_generate, speculative_generate
from specdec_tune.runtime.drafting.drafters import ModelDrafter, PromptLookupDrafter

pytestmark = pytest.mark.slow

SAMPLES = 8_000
VOCAB = 8
DEPTH = 3  # tokens per sample whose joint is tested: two verified drafts + the bonus or residual token
P_PASS = 1e-3  # a correct sampler must score above this
P_FAIL = 1e-6  # a planted bug must score below this


# --- χ² goodness of fit ------------------------------------------------------------------------


def _upper_gamma_regularized(a: float, x: float) -> float:
    """Q(a, x) = Γ(a, x) / Γ(a): series below x = a + 1, Lentz continued fraction above."""
    if x <= 0.0:
        return 1.0
    log_front = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1.0:
        term = total = 1.0 / a
        n = a
        while abs(term) > abs(total) * 1e-16:
            n += 1.0
            term *= x / n
            total += term
        return max(0.0, 1.0 - total * math.exp(log_front))
    tiny = 1e-300
    b = x + 1.0 - a
    c, d = 1.0 / tiny, 1.0 / b
    h = d
    for i in range(1, 100_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = b + an / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        if abs(d * c - 1.0) < 1e-16:
            break
    return math.exp(log_front) * h


def chi2_sf_fallback(x: float, dof: int) -> float:
    return _upper_gamma_regularized(dof / 2.0, x / 2.0)


try:
    from scipy.stats import chi2 as _scipy_chi2

    def chi2_sf(x: float, dof: int) -> float:
        return float(_scipy_chi2.sf(x, dof))

except ImportError:  # scipy is not a dependency
    chi2_sf = chi2_sf_fallback


def chi2_p_value(counts: Counter, probs: dict[tuple[int, ...], float]) -> float:
    """Pearson χ² of observed `counts` against `probs`; cells expected below 5 are pooled."""
    return chi2_sf(*chi2_statistic(counts, probs))


def chi2_statistic(counts: Counter, probs: dict[tuple[int, ...], float]) -> tuple[float, int]:
    """The pooled Pearson χ² statistic and its degrees of freedom (benchmarks/sampling_power.py)."""
    n = sum(counts.values())
    bins: list[tuple[float, int]] = []  # (expected, observed)
    pool_e, pool_o = 0.0, 0
    for cell in sorted(probs, key=probs.get):  # ascending: the small cells pool with each other
        pool_e, pool_o = pool_e + n * probs[cell], pool_o + counts.get(cell, 0)
        if pool_e >= 5.0:
            bins.append((pool_e, pool_o))
            pool_e, pool_o = 0.0, 0
    stat = sum((o - e) ** 2 / e for e, o in bins)
    return stat, max(len(bins) - 1, 1)


# --- a fast stand-in for the forward pass ------------------------------------------------------


class _CacheConfig:
    """Just what DynamicCache(config=...) reads: one full-attention layer (a LlamaConfig costs 0.25 ms)."""

    layer_types = ("full_attention",)

    def __init__(self) -> None:
        self.per_layer_config = [self]

    def get_text_config(self, decoder: bool = False) -> _CacheConfig:
        return self


class Memoized:
    """A model's logits computed once per distinct prefix, so thousands of generations cost seconds.

    The sampler under test (engine loop, drafters, verifier) runs unchanged; only the forward pass
    is a lookup. A real DynamicCache still travels through every call and is grown and cropped as
    the model's own would be, and its length decides which prefix is looked up, so a cache-handling
    bug shows up as wrong logits here just as it would with the model itself.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.config = _CacheConfig()
        self.memo: dict[tuple[int, ...], torch.Tensor] = {}
        self._kv = [torch.zeros(1, 1, n, 1) for n in range(16)]

    def parameters(self):
        return self.model.lm_head.parameters()  # where the engine looks for the device

    def next_logits(self, prefix: tuple[int, ...]) -> torch.Tensor:
        if prefix not in self.memo:
            with torch.inference_mode():
                out = self.model(input_ids=torch.tensor([prefix])).logits[0]
            for i in range(len(prefix)):
                self.memo.setdefault(prefix[: i + 1], out[i])
        return self.memo[prefix]

    def forward(self, input_ids, cache=None, use_cache=True, logits_to_keep=0):
        seen = cache.get_seq_length()
        tokens = cache.__dict__.setdefault("memo_tokens", [])
        del tokens[seen:]  # the engine cropped the cache: forget what it dropped
        tokens.extend(input_ids[0].tolist())
        kv = self._kv[input_ids.shape[1]]
        cache.update(kv, kv, 0)
        logits = torch.stack([self.next_logits(tuple(tokens[: j + 1])) for j in range(seen, len(tokens))])
        if logits_to_keep:
            logits = logits[-logits_to_keep:]
        return SimpleNamespace(logits=logits[None])

    __call__ = forward
    # cache_kwarg() inspects forward's signature on every generation; a stored one is found at once.
    forward.__signature__ = inspect.signature(forward)


def exact_joint(target: Memoized, prompt: list[int], temperature: float, depth: int) -> dict:
    """P(first `depth` tokens = cell) under the target sampled at `temperature`, in float64."""
    joint = {(): 1.0}
    for _ in range(depth):
        nxt = {}
        for cell, prob in joint.items():
            logits = target.next_logits(tuple(prompt) + cell).double()
            p = torch.softmax(logits / temperature, -1).tolist()
            nxt.update({(*cell, t): prob * pt for t, pt in enumerate(p)})
        joint = nxt
    return joint


class Recording(ModelDrafter):
    """A model drafter that remembers how many tokens each proposal had."""

    def __init__(self, model, threshold_mode=None):
        super().__init__(model, threshold_mode=threshold_mode)
        self.lengths: Counter = Counter()

    def propose(self, seq, gamma, threshold, temperature, generator):
        draft, q = super().propose(seq, gamma, threshold, temperature, generator)
        self.lengths[draft.numel()] += 1
        return draft, q


def sample_speculative(target, drafter, prompt, gamma, threshold, temperature, seed):
    generator = torch.Generator().manual_seed(seed)
    counts, stats = Counter(), SpecStats()
    for _ in range(SAMPLES):
        gen = speculative_generate(
            target, drafter, prompt, gamma, threshold, temperature, DEPTH, generator=generator
        )
        counts[tuple(gen.tokens)] += 1
        stats.add(gen.stats)
    return counts, stats


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(layers=1, hidden=16, vocab=VOCAB, seed=3, init=0.5)
    return {
        "target": Memoized(target),
        "noisy": Memoized(noisy_copy(target, 0.3, seed=4)),
        "random": Memoized(tiny_llama(layers=1, hidden=16, vocab=VOCAB, seed=11, init=0.5)),
    }


# --- the χ² helper itself ----------------------------------------------------------------------


def _chi2_sf_closed_form(x: float, dof: int) -> float:
    if dof % 2 == 0:
        return sum(math.exp(-x / 2 + i * math.log(x / 2) - math.lgamma(i + 1)) for i in range(dof // 2))
    total, term = math.erfc(math.sqrt(x / 2)), math.sqrt(2 * x / math.pi) * math.exp(-x / 2)
    for k in range(3, dof + 1, 2):
        total += term
        term *= x / k
    return total


@pytest.mark.parametrize("dof", [1, 2, 3, 7, 10, 61, 400])
def test_chi2_survival_function(dof):
    for x in (0.1, 1.0, dof * 0.5, float(dof), dof + 3 * math.sqrt(2 * dof), dof * 3.0 + 20):
        assert chi2_sf_fallback(x, dof) == pytest.approx(_chi2_sf_closed_form(x, dof), rel=1e-9), (x, dof)


def test_chi2_p_value_pools_small_cells():
    probs = {(0,): 0.5, (1,): 0.4997, (2,): 0.0001, (3,): 0.0002}
    fair = Counter({(0,): 5000, (1,): 4997, (2,): 1, (3,): 2})
    assert chi2_p_value(fair, probs) > 0.5
    assert chi2_p_value(Counter({(0,): 5500, (1,): 4500}), probs) < 1e-6


# --- exactness ---------------------------------------------------------------------------------


def test_model_draft_sampling_is_exact(pair):
    """Noisy-copy draft, γ 3, T 1.0: joint of the first 3 tokens has χ² p-value > 1e-3."""
    target, prompt = pair["target"], [1]
    counts, stats = sample_speculative(target, ModelDrafter(pair["noisy"]), prompt, 3, 0.0, 1.0, seed=1)
    assert 0.2 < stats.acceptance_rate < 0.9  # p != q: both branches of the verifier are taken
    assert chi2_p_value(counts, exact_joint(target, prompt, 1.0, DEPTH)) > P_PASS


def test_random_draft_sampling_is_exact(pair):
    """An unrelated random draft, γ 2, T 1.0: mostly rejections and residuals; p-value > 1e-3."""
    target, prompt = pair["target"], [2, 5]
    counts, stats = sample_speculative(target, ModelDrafter(pair["random"]), prompt, 2, 0.0, 1.0, seed=2)
    assert 0.0 < stats.acceptance_rate < 0.7
    assert chi2_p_value(counts, exact_joint(target, prompt, 1.0, DEPTH)) > P_PASS


def test_confidence_threshold_sampling_is_exact(pair):
    """Threshold 0.3 at T 0.7: drafting stops after an unsure token, output stays exact (p > 1e-3)."""
    target, prompt = pair["target"], [1]
    drafter = Recording(pair["noisy"])
    counts, _ = sample_speculative(target, drafter, prompt, 3, 0.3, 0.7, seed=3)
    assert drafter.lengths[1] > 0 and drafter.lengths[2] > 0  # both the early stop and the full draft
    assert chi2_p_value(counts, exact_joint(target, prompt, 0.7, DEPTH)) > P_PASS


def test_topk10_threshold_sampling_is_exact(pair):
    """llama.cpp's p-min (top-10 renormalised, unsure token dropped), t 0.4 at T 0.7: p > 1e-3."""
    target, prompt = pair["target"], [1]
    drafter = Recording(pair["noisy"], threshold_mode="topk10")
    counts, _ = sample_speculative(target, drafter, prompt, 3, 0.4, 0.7, seed=7)
    # no draft at all (stopped before the first token), a stop mid-way, and the full draft (DEPTH - 1)
    assert drafter.lengths[0] > 0 and drafter.lengths[1] > 0 and drafter.lengths[2] > 0
    assert chi2_p_value(counts, exact_joint(target, prompt, 0.7, DEPTH)) > P_PASS


def test_prompt_lookup_sampling_is_exact(pair):
    """Prompt lookup (q is a point mass), T 1.0, on a repetitive prompt: p-value > 1e-3."""
    target, prompt = pair["target"], [1, 2, 3, 1, 2, 3, 1, 2]
    counts, stats = sample_speculative(target, PromptLookupDrafter(1, 3), prompt, 3, 0.0, 1.0, seed=4)
    assert stats.proposed > SAMPLES and stats.accepted > 0
    assert chi2_p_value(counts, exact_joint(target, prompt, 1.0, DEPTH)) > P_PASS


def test_autoregressive_sampling_is_exact(pair):
    """The baseline sampler at T 1.0: p-value > 1e-3."""
    target, prompt = pair["target"], [1]
    generator = torch.Generator().manual_seed(5)
    counts = Counter(
        tuple(autoregressive_generate(target, prompt, DEPTH, 1.0, generator=generator).tokens)
        for _ in range(SAMPLES)
    )
    assert chi2_p_value(counts, exact_joint(target, prompt, 1.0, DEPTH)) > P_PASS


# --- power: the same test catches a biased verifier --------------------------------------------


def _resample_from_p(logits, draft, q, temperature, generator):
    """Correct acceptance, but a rejection resamples from p instead of norm(max(0, p - q)).

    (Accepting every draft token is caught as surely, p ~ 0; this bug is the subtler one.)
    """
    p = torch.softmax(logits.float() / temperature, -1)
    k = draft.numel()
    q_tok = q[torch.arange(k), draft] if q is not None else torch.ones(k)
    u = torch.rand(k, generator=generator)
    n = int((u * q_tok < p[torch.arange(k), draft]).cumprod(0).sum())
    return n, [*draft[:n].tolist(), int(torch.multinomial(p[n], 1, generator=generator))]


def test_biased_verifier_is_detected(pair, monkeypatch):
    """The classic bug planted in the verifier (resample from p, not the residual): χ² p < 1e-6."""
    monkeypatch.setattr(engine, "verify_sampling", _resample_from_p)
    target, prompt = pair["target"], [1]
    counts, _ = sample_speculative(target, ModelDrafter(pair["noisy"]), prompt, 3, 0.0, 1.0, seed=6)
    assert chi2_p_value(counts, exact_joint(target, prompt, 1.0, DEPTH)) < P_FAIL
