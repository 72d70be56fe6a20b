"""Is batch 1 just B = 1 of the batched path? The batch-1 engine (`measure.bench.run_pass`, i.e.
`runtime.decode`) against the batched engine at B = 1 (`runtime.batch.batch_generate`) on the demo
pair, for plain decoding, draft-1l, prompt lookup and the hybrid, timed interleaved in ONE run
(`timing.interleaved`: order reversed every other repeat, so each pair runs ABBA), warm-up excluded.

Per config: tokens/s of each path (median over repeats), the per-repeat ratio batched/batch-1
(median, min, max) and whether both paths produce the same greedy tokens (and the plain target's).
The issue's bar: every ratio within 3 % of 1. With --split, also the batch-1 loop driving the
row-keyed drafter at one row, which splits the gap into the drafter's part and the loop's.

    python benchmarks/parity.py [--prompts 8] [--max-new-tokens 32] [--gamma 4] [--repeats 8] [--split]
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

from specdec_tune.atomic import atomic_write_text
from specdec_tune.measure.bench import run_pass
from specdec_tune.measure.timing import interleaved, median
from specdec_tune.runtime.batch import batch_generate
from specdec_tune.runtime.drafting.build import build_drafter
from specdec_tune.runtime.drafting.rows import OneRow
from specdec_tune.runtime.session import DEMO_HYBRID, load_models

CONFIGS = ("plain", "draft-1l", "prompt-lookup", DEMO_HYBRID)
BAR = 0.03


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--engine", default="eager", help="engine mode: eager, static, compiled, auto")
    ap.add_argument(
        "--split",
        action="store_true",
        help="also time the batch-1 loop with the row-keyed drafter at one row",
    )
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/parity.json"))
    args = ap.parse_args()

    s = load_models(
        None, ["draft-1l", "prompt-lookup", DEMO_HYBRID], "demo-code", args.max_new_tokens, 0.0, "cpu",
        "auto", limit=args.prompts, engine_mode=args.engine,
    )  # fmt: skip
    target, ctx, case = s.target.model, s.ctx, s.case.head(args.prompts)
    specs = {spec.name: spec for spec in s.specs}
    runs = {}
    for name in CONFIGS:
        g = 0 if name == "plain" else args.gamma
        one = None if g == 0 else build_drafter(specs[name], target, s.draft_modules, ctx)
        rows = None if g == 0 else build_drafter(specs[name], target, s.draft_modules, ctx, rows=1)
        runs[(name, "batch-1")] = lambda r, d=one, g=g: run_pass(target, d, g, 0.0, case, ctx=ctx)[0]
        runs[(name, "B=1")] = lambda r, d=rows, g=g: batch_generate(target, d, case, 1, g, ctx=ctx).outputs
        if args.split and g:  # the batch-1 loop driving the row-keyed drafter at one row
            mixed = OneRow(build_drafter(specs[name], target, s.draft_modules, ctx, rows=1))
            runs[(name, "split")] = lambda r, d=mixed, g=g: run_pass(target, d, g, 0.0, case, ctx=ctx)[0]
    for fn in runs.values():  # warm-up, untimed
        fn(0)
    timed = interleaved(runs, args.repeats, "cpu")

    want = timed[("plain", "batch-1")][-1][1]
    out = {
        "machine": platform.processor() or platform.machine(),
        "engine": ctx.mode,
        "args": vars(args) | {"out": str(args.out)},
        "configs": {},
    }
    header = (
        f"{'config':<32} {'batch-1 tok/s':>13} {'B=1 tok/s':>10} {'B=1/batch-1 med [min, max]':>28}  same"
    )
    print(f"engine {ctx.mode}, {len(case.prompts)} prompts x {args.max_new_tokens} tokens, "
          f"gamma {args.gamma}, {args.repeats} repeats (ABBA)")  # fmt: skip
    print(header)
    ok = True
    split: dict[str, tuple[list[float], list[float], bool]] = {}
    for name in CONFIGS:
        a, b = timed[(name, "batch-1")], timed[(name, "B=1")]
        ra = [sum(map(len, o)) / sec for sec, o in a]
        rb = [sum(map(len, o)) / sec for sec, o in b]
        ratios = [y / x for x, y in zip(ra, rb, strict=True)]
        same = all(o == oa for (_, o), (_, oa) in zip(b, a, strict=True)) and a[-1][1] == want
        within = abs(median(ratios) - 1) <= BAR
        ok = ok and within and same
        label = name if name == "plain" else f"{name} γ{args.gamma}"
        print(
            f"{label:<32} {median(ra):>13.1f} {median(rb):>10.1f} "
            f"{median(ratios):>10.3f} [{min(ratios):.3f}, {max(ratios):.3f}]      {'yes' if same else 'NO'}"
        )
        out["configs"][label] = {
            "batch1_tok_s": [round(x, 2) for x in ra],
            "b1_tok_s": [round(x, 2) for x in rb],
            "ratio_median": round(median(ratios), 4),
            "ratio_min": round(min(ratios), 4),
            "ratio_max": round(max(ratios), 4),
            "identical_greedy_tokens": same,
            "within_3pct": within,
        }
        if (name, "split") in timed:
            rs = [sum(map(len, o)) / sec for sec, o in timed[(name, "split")]]
            drafter = [z / x for x, z in zip(ra, rs, strict=True)]  # row drafter, batch-1 loop
            loop = [y / z for z, y in zip(rs, rb, strict=True)]  # batched loop, same drafter
            same = same and all(o == oa for (_, o), (_, oa) in zip(timed[(name, "split")], a, strict=True))
            split[label] = (drafter, loop, same)
            out["configs"][label] |= {
                "row_drafter_in_batch1_loop_tok_s": [round(x, 2) for x in rs],
                "drafter_ratio_median": round(median(drafter), 4),
                "loop_ratio_median": round(median(loop), 4),
            }
    out["parity"] = ok
    print(f"parity (every median within {BAR:.0%}, identical tokens): {'yes' if ok else 'no'}")
    if split:
        print("where B=1 loses, per repeat: drafter = batch-1 loop with the row drafter / batch-1;")
        print("loop = B=1 / batch-1 loop with the row drafter (their product is B=1 / batch-1)")
        for label, (drafter, loop, same) in split.items():
            print(
                f"{label:<32} drafter {median(drafter):.3f} [{min(drafter):.3f}, {max(drafter):.3f}]"
                f"  loop {median(loop):.3f} [{min(loop):.3f}, {max(loop):.3f}]  same {'yes' if same else 'NO'}"
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
