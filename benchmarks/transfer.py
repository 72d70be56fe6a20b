"""Does a config tuned in our own loop transfer to llama.cpp? The same configs measured in both
backends, each against its own plain decoding (interleaved), on the demo pair and on SmolLM2:
speedup per config in each, Spearman rank correlation, gamma* per draft per backend, and what
deploying the native winner in llama.cpp loses against the llama.cpp winner.

Config pairs (native <-> llama.cpp): prompt-lookup:N-N <-> ngram-simple:N (one n-gram size, latest
match), a draft model <-> its GGUF (demo: draft-1l; SmolLM2: the first K blocks, layer-skip:K, cut
as a GGUF for llama.cpp), at several gamma.

    python benchmarks/transfer.py [--pairs demo,smollm2] [--prompts 4] [-n 64] [--repeats 3]

Writes benchmarks/results/transfer.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from specdec_tune import app
from specdec_tune.backends.llamacpp import open_engine
from specdec_tune.domain import Config
from specdec_tune.measure.bench import Entry, measure_many
from specdec_tune.measure.llamacpp.server import servers_die_with_us
from specdec_tune.runtime.drafting.build import build_drafter
from specdec_tune.runtime.session import load_models

PAIRS = {
    # name: (native target, llama.cpp target, [(native draft, llama.cpp draft)], gammas)
    "demo": (None, "demo", [("prompt-lookup:3-3", "ngram-simple:3"), ("draft-1l", "DEMO_DRAFT")], (2, 4, 6)),
    "smollm2": (
        "smollm2-135m",
        "smollm2-135m",
        [("prompt-lookup:3-3", "ngram-simple:3"), ("layer-skip:{k}", "layer-skip:{k}")],
        (2, 4, 6),
    ),
}


def spearman(a: list[float], b: list[float]) -> float:
    def ranks(x: list[float]) -> list[float]:
        order = sorted(range(len(x)), key=lambda i: x[i])
        r = [0.0] * len(x)
        for pos, i in enumerate(order):
            r[i] = float(pos)
        return r

    ra, rb = ranks(a), ranks(b)
    n = len(a)
    d2 = sum((x - y) ** 2 for x, y in zip(ra, rb, strict=True))
    return 1 - 6 * d2 / (n * (n * n - 1)) if n > 1 else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", default="demo,smollm2")
    ap.add_argument("--workload", default="code-edit")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("-n", "--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--layer-skip", type=int, default=20)
    ap.add_argument("--threads", type=int, default=None, help="engine threads (default: every core)")
    args = ap.parse_args()
    report: dict = {"args": vars(args), "pairs": {}}
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    for pair in args.pairs.split(","):
        native_target, engine_target, drafts, gammas = PAIRS[pair]
        drafts = [(n.format(k=args.layer_skip), e.format(k=args.layer_skip)) for n, e in drafts]
        t0 = time.monotonic()
        # --- native: every config and the baseline in ONE interleaved run
        s = load_models(
            native_target,
            [n for n, _ in drafts],
            args.workload,
            args.max_new_tokens,
            limit=args.prompts,
            lazy_drafts=False,
            engine_mode="eager",
        )
        native_cfgs = [(spec, g) for spec in s.specs for g in gammas]
        entries = [
            Entry(build_drafter(spec, s.target.model, s.draft_modules), g, 0.0) for spec, g in native_cfgs
        ]
        ms = measure_many(s.target.model, entries, s.case, args.repeats, ctx=s.ctx)
        native = [round(m.metrics.speedup, 4) for m in ms]
        native_mismatch = [m.mismatches for m in ms]
        native_s = time.monotonic() - t0
        # --- llama.cpp: each config against the plain server, interleaved
        t0 = time.monotonic()
        with servers_die_with_us():
            models = app.Models(
                target=engine_target,
                workload=args.workload,
                prompts=args.prompts,
                max_new_tokens=args.max_new_tokens,
                backend="llamacpp",
                threads=args.threads,
            )
            if any(e == "DEMO_DRAFT" for _, e in drafts):
                from specdec_tune.runtime.models.ggufs import demo_gguf_paths

                demo_draft = str(demo_gguf_paths()["draft"])
                drafts = [(n, demo_draft if e == "DEMO_DRAFT" else e) for n, e in drafts]
            models.drafts = [e for _, e in drafts]
            es = open_engine(models)
            try:
                engine_cfgs = [(spec, g) for spec in es.specs for g in gammas]
                engine, engine_exact = [], []
                for spec, g in engine_cfgs:
                    (m,) = es.backend.measure([Config(spec, g)], es.case, 1, args.repeats)
                    engine.append(round(m.metrics.speedup, 4))
                    engine_exact.append(m.mismatches)
                build = es.backend.info()
            finally:
                es.close()
        engine_s = time.monotonic() - t0
        labels = [f"{n} / {e.split('/')[-1]} γ={g}" for n, e in drafts for g in gammas]
        best_native = max(range(len(native)), key=lambda i: native[i])
        best_engine = max(range(len(engine)), key=lambda i: engine[i])
        gamma_star = {}
        for j, (n, _) in enumerate(drafts):
            idx = range(j * len(gammas), (j + 1) * len(gammas))
            gamma_star[n] = {
                "native": gammas[max(idx, key=lambda i: native[i]) - j * len(gammas)],
                "llamacpp": gammas[max(idx, key=lambda i: engine[i]) - j * len(gammas)],
            }
        report["pairs"][pair] = {
            "configs": labels,
            "native_speedup": native,
            "llamacpp_speedup": engine,
            "native_mismatches": native_mismatch,
            "llamacpp_mismatches": engine_exact,
            "spearman": round(spearman(native, engine), 3),
            "gamma_star": gamma_star,
            "native_winner": labels[best_native],
            "llamacpp_winner": labels[best_engine],
            "native_winner_in_llamacpp": engine[best_native],
            "llamacpp_winner_in_llamacpp": engine[best_engine],
            "loss_deploying_native_winner": round(1 - engine[best_native] / engine[best_engine], 4),
            "plain_tok_s_native": round(ms[0].metrics.baseline_tokens_per_s, 1),
            "seconds": {"native": round(native_s), "llamacpp": round(engine_s)},
            "build": build,
        }
        print(json.dumps(report["pairs"][pair], indent=1, default=str), flush=True)
    out = Path(__file__).parent / "results" / "transfer.json"
    out.write_text(json.dumps(report, indent=1, default=str))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
