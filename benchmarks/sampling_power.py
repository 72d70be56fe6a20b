"""The power of the χ² sampling tests at a smaller sample size: the statistic and p-value of the
planted verifier bug (resample from p, not the residual) and of the correct sampler, with the tests'
own seeds, models and prompts (tests/runtime/test_sampling.py, test_dynamic.py, test_batch.py).

    python benchmarks/sampling_power.py [N ...]     # default 20000 6000; ~80 s on 2 cores

A bug adds about N x (its χ² per sample) to the statistic; the tests state the power this gives.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path[:0] = [str(TESTS), str(TESTS / "runtime")]

import test_batch as tb  # noqa: E402
import test_dynamic as td  # noqa: E402
import test_sampling as ts  # noqa: E402
from helpers import noisy_copy, tiny_llama  # noqa: E402

from specdec_tune.runtime import batch  # noqa: E402
from specdec_tune.runtime import decode as engine  # noqa: E402
from specdec_tune.runtime.drafting.drafters import ModelDrafter, PromptLookupDrafter  # noqa: E402
from specdec_tune.runtime.drafting.hybrid import HybridDrafter  # noqa: E402


def show(what: str, counts, probs) -> None:
    s, d = ts.chi2_statistic(counts, probs)
    print(f"{what}: chi2 {s:.0f} on {d} dof, p {ts.chi2_p_value(counts, probs):.3g}", flush=True)


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [20_000, 6_000]
    model = tiny_llama(layers=1, hidden=16, vocab=ts.VOCAB, seed=3, init=0.5)
    target, noisy = ts.Memoized(model), ts.Memoized(noisy_copy(model, 0.3, seed=4))
    correct = engine.verify_sampling
    for n in sizes:
        ts.SAMPLES = n
        t0 = time.monotonic()
        joint = ts.exact_joint(target, [1], 1.0, ts.DEPTH)
        mixed = ts.exact_joint(target, td.MIXED_PROMPT, 1.0, ts.DEPTH)
        engine.verify_sampling = ts._resample_from_p
        counts, _ = ts.sample_speculative(target, ModelDrafter(noisy), [1], 3, 0.0, 1.0, seed=6)
        show(f"N={n} planted bug, model draft", counts, joint)
        hybrid = HybridDrafter(PromptLookupDrafter(1, 3), ModelDrafter(noisy, "noisy"), "hybrid")
        counts, _ = ts.sample_speculative(target, hybrid, td.MIXED_PROMPT, 3, 0.0, 1.0, seed=23)
        show(f"N={n} planted bug, hybrid draft", counts, mixed)
        engine.verify_sampling = correct
        counts, _ = ts.sample_speculative(target, ModelDrafter(noisy), [1], 3, 0.0, 1.0, seed=1)
        show(f"N={n} correct sampler, model draft", counts, joint)
        print(f"  ({time.monotonic() - t0:.1f} s)", flush=True)
    for n in (3000, 1500):
        correct_batch = batch.verify_sampling
        batch.verify_sampling = ts._resample_from_p
        show(f"batched n={n} planted bug", *tb._first_two_tokens(n))
        show(f"batched hybrid n={n} planted bug", *td._batched_first_two(n))
        batch.verify_sampling = correct_batch


if __name__ == "__main__":
    main()
