"""Where the batched cost model loses accuracy at large B: verification, drafting and per-step
overhead clocked inside real closed-loop runs (`surface.loop_costs`) at gamma 2, 4 and 6, beside
the micro-benchmarked surface (dense rows, and ragged rows that take the masked attention path).

    python benchmarks/loop_vs_micro.py [--batch-size 16] [--engine eager]   # ~2 min on 2 cores
"""

from __future__ import annotations

import argparse
import json

from specdec_tune.measure import surface
from specdec_tune.measure.forward import context_ids, vocab_size
from specdec_tune.runtime.drafting.build import build_drafter
from specdec_tune.runtime.session import load_models, parse_draft
from specdec_tune.runtime.workloads import Case


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--engine", default="eager")
    ap.add_argument("--context-len", type=int, default=70)
    args = ap.parse_args()
    s = load_models(None, ["draft-1l"], "demo-code", 32, engine_mode=args.engine, lazy_drafts=False)
    target, b = s.target.model, args.batch_size
    spec = parse_draft("draft-1l")
    prompts = (s.case.prompts * (2 * b // len(s.case.prompts) + 2))[: 2 * b]
    case = Case(prompts, [32] * len(prompts), s.case.eos, 0.0)
    out: dict = {"batch_size": b, "engine": args.engine}
    out["micro_dense_ms"] = surface.verify_surface_ms(target, b, args.context_len, 6, 3)

    def ragged(kv, vocab, context_len):  # rows at different lengths: the masked path
        for r in range(kv.rows):
            kv.prefill(r, context_ids(vocab, context_len - (r % 4), seed=1234 + r))

    dense = surface._prefill_rows
    surface._prefill_rows = ragged
    out["micro_ragged_ms"] = surface.verify_surface_ms(target, b, args.context_len, 6, 3)
    surface._prefill_rows = dense
    make = {"draft-1l": lambda rows: build_drafter(spec, target, s.draft_modules, rows=rows)}
    out["micro_t_draft_ms"] = surface.draft_cost_ms(
        make["draft-1l"](b), vocab_size(target), args.context_len, 3, 4
    )
    out["loop"] = {g: surface.loop_costs(target, make, case, b, g, repeats=2) for g in (2, 4, 6)}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
