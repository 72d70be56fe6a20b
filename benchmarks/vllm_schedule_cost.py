"""Does a batch-size schedule cost anything where it runs the same K as a fixed server? Three vLLM
servers of one n-gram draft at B > 1, interleaved (ABBA) without a plain side: fixed gamma K, a
schedule that runs K at every batch size with `num_speculative_tokens` K (vLLM's dynamic path
alone), and the same schedule with `num_speculative_tokens` M > K (as a schedule that also runs M
somewhere starts). Prints each one's tokens/s per repeat and its paired ratio to the fixed server.

Why: the measured schedule `[[1, 2, 8], [3, 1024, 5]]` read 0.955-0.993 of fixed gamma 5 at B = 3
and 4 in five runs (docs/vllm.md), where it runs K = 5 but for the drain through B = 2 and 1.

    SPECDEC_VLLM_PYTHON=.vllm-venv/bin/python python benchmarks/vllm_schedule_cost.py
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specdec_tune import app  # noqa: E402
from specdec_tune.backends.base import Purpose  # noqa: E402
from specdec_tune.backends.vllm.args import parse_vllm_draft  # noqa: E402
from specdec_tune.backends.vllm.schedule import LAST_BATCH, SCHEDULE_POLICY  # noqa: E402
from specdec_tune.backends.vllm.session import VllmSession  # noqa: E402
from specdec_tune.domain import Config  # noqa: E402
from specdec_tune.measure.servers import servers_die_with_us  # noqa: E402
from specdec_tune.measure.stats import compare  # noqa: E402
from specdec_tune.measure.timing import median  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--draft", default="ngram:4")
    ap.add_argument("-k", type=int, default=5, help="the K every side runs")
    ap.add_argument("-m", type=int, default=8, help="num_speculative_tokens of the third side")
    ap.add_argument("--batch-sizes", default="4")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("-n", type=int, default=32, help="new tokens per request")
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/vllm/schedule_cost.json")
    a = ap.parse_args()
    draft = parse_vllm_draft(a.draft)
    models = app.Models(
        target=a.target, workload="code-edit", prompts=a.prompts, max_new_tokens=a.n, backend="vllm",
        drafts=[draft],
    )  # fmt: skip
    fixed = Config(draft, a.k)
    same = Config(draft, a.k, gamma_policy=SCHEDULE_POLICY)  # the dynamic path, max K = K
    wider = Config(draft, a.m, gamma_policy=SCHEDULE_POLICY)  # the dynamic path, max K = M
    sides = {"fixed": fixed, f"schedule K{a.k} max {a.k}": same, f"schedule K{a.k} max {a.m}": wider}
    out: dict = {"target": a.target, "draft": a.draft, "k": a.k, "m": a.m, "rows": []}
    t0 = time.monotonic()
    with servers_die_with_us():
        s = VllmSession(models, Purpose())
        try:
            s.backend.schedules[same.key] = [[1, LAST_BATCH, a.k]]
            s.backend.schedules[wider.key] = [[1, LAST_BATCH, a.k]]
            for b in (int(x) for x in a.batch_sizes.split(",")):
                rates = s.backend.rates(list(sides.values()), s.case, b, a.repeats)
                row = {"batch_size": b, "tok_s": {}, "vs_fixed": {}}
                for (name, _), r in zip(sides.items(), rates, strict=True):
                    row["tok_s"][name] = [round(x, 2) for x in r]
                    if name != "fixed":
                        c = compare(r, rates[0])
                        row["vs_fixed"][name] = [round(c.ratio, 4), [round(x, 4) for x in c.interval]]
                    print(f"B={b} {name}: median {median(r):.1f} tok/s", flush=True)
                print(f"B={b} vs fixed: {row['vs_fixed']}", flush=True)
                out["rows"].append(row)
            out["build"] = s.backend.info()["build"]
        finally:
            s.close()
    out["seconds"] = round(time.monotonic() - t0, 1)
    a.out.write_text(json.dumps(out, indent=1))
    print(f"{out['seconds']} s; wrote {a.out}")


if __name__ == "__main__":
    main()
