"""How far apart do llama.cpp server pairs of one config read on the check slice?

In one process moved to the check slice (measure.narrow, or pinned to `--core`), the profile's best
config against plain decoding, K times R repeats, each K in a new server pair (`renew`: a new plain
server; the config's server is new at every measurement). Prints each pair's repeats and median,
and the medians' relative standard deviation: the level one server pair carries, which `check`
(one pair per repeat: `LlamaCppBackend.pair_per_repeat`) spreads over its repeats.

    python benchmarks/llamacpp_pairs.py profiles/cpu-amd-epyc-2t/smollm2-135m.llamacpp.code-edit.yaml
    python benchmarks/llamacpp_pairs.py PROFILE --pairs 2 --repeats 3 --core 1
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specdec_tune.app.profile_models import open_stored, stored_models  # noqa: E402
from specdec_tune.backends.base import Purpose  # noqa: E402
from specdec_tune.measure import narrow  # noqa: E402
from specdec_tune.store.yamlio import load_profile  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("profile", type=Path)
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--core", type=int, default=None, help="pin here instead of the check slice")
    a = ap.parse_args()
    p = load_profile(a.profile)
    if a.core is None:
        where = narrow.take()
        core = where.core if where is not None else None
    else:
        import torch

        narrow.pin_all_threads(a.core)
        torch.set_num_threads(narrow.SLICE_THREADS)
        core = a.core
    print(f"core {core}", flush=True)
    models = stored_models(p, a.profile, [p.best.config.draft], threads=narrow.SLICE_THREADS)
    purpose = Purpose("tune", costs=p.costs)  # a search's session: one pair per measurement
    with open_stored(p, a.profile, models, purpose, allow_other_hardware=True) as s:
        by_name = {d.name: d for d in s.specs}
        config = replace(p.best.config, draft=by_name.get(p.best.config.draft.name, p.best.config.draft))
        s.measure([config], s.case, 1, 1)  # untimed: exactness, the prompts' saved states
        medians = []
        for k in range(a.pairs):
            started = time.monotonic()
            s.renew()
            (m,) = s.measure([config], s.case, 1, a.repeats)
            medians.append(statistics.median(m.speedups))
            print(
                f"pair {k}: {[round(x, 3) for x in m.speedups]} median {medians[-1]:.3f} "
                f"({time.monotonic() - started:.1f} s)",
                flush=True,
            )
    sd = statistics.stdev(medians) / statistics.mean(medians) if len(medians) > 1 else 0.0
    print(f"medians {[round(x, 3) for x in medians]}, sd {100 * sd:.1f} %")


if __name__ == "__main__":
    main()
