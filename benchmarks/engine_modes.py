"""Engine modes on the demo pair: eager vs static vs compiled costs and speedups.

For each mode: T_target and C_ver(1..8) at the workload's mid-generation context (interleaved
micro-benchmark), T_draft of the 1-layer draft through the lean Llama forward and through the
mode's own cache (which of the two to keep), compile time and graphs built, the roofline share of
the decode step (weights + KV bytes per step / T_target / copy bandwidth), and speedups of a few
configs against the plain target of the SAME mode (one interleaved run per mode), with the
recompiles counted inside the timed loop (must be 0: the loop is run once untimed first).

    python benchmarks/engine_modes.py            # ~6 min on a 2-core CPU (compiling included)
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from specdec_tune.measure.bench import Entry, measure_many
from specdec_tune.measure.costs import default_context_len, measure_t_draft_ms
from specdec_tune.measure.forward import (
    decode_weight_bytes,
    forward_curve_ms,
    measure_copy_bandwidth_gbps,
)
from specdec_tune.measure.timing import median
from specdec_tune.runtime.caches import modes, slots
from specdec_tune.runtime.drafting.build import build_drafter
from specdec_tune.runtime.drafting.drafters import ModelDrafter
from specdec_tune.runtime.session import load_models, parse_draft

CONFIGS = [("draft-1l", 5), ("draft-1l", 3), ("prompt-lookup", 4), ("hybrid:prompt-lookup+draft-1l", 6)]


def kv_bytes_per_step(model, context: int) -> int:
    cfg = model.config
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    size = next(model.parameters()).element_size()
    return 2 * cfg.num_hidden_layers * heads * dim * context * size


def linears_only_ms(model, repeats: int = 50) -> float:
    """Every 2-D weight of the model applied to one token's activations, back to back, no Python
    around them: the floor a decode step cannot go below with these matmul kernels."""
    weights = [p for p in model.parameters() if p.dim() == 2]
    inputs = [torch.randn(1, w.shape[1], dtype=w.dtype) for w in weights]
    with torch.inference_mode():

        def run() -> None:
            for w, x in zip(weights, inputs, strict=True):
                torch.nn.functional.linear(x, w)

        for _ in range(5):
            run()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            run()
            times.append((time.perf_counter() - t0) * 1e3)
    return median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="eager,static,compiled")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/engine_modes.json"))
    args = ap.parse_args()

    s = load_models(None, ["draft-1l", "prompt-lookup"], limit=args.prompts, engine_mode="eager")
    target, draft = s.target.model, s.draft_model(parse_draft("draft-1l"))
    context = default_context_len(s.case)
    longest = max(len(p) + b for p, b in zip(s.case.prompts, s.case.max_new_tokens, strict=True))
    copy_gbps, _ = measure_copy_bandwidth_gbps("cpu", repeats=5)
    step_bytes = decode_weight_bytes(target) + kv_bytes_per_step(target, context)
    seq = s.case.prompts[0][:context]
    report = {
        "machine": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "context_len": context,
        "copy_bandwidth_gbps": copy_gbps,
        "decode_step_bytes": step_bytes,
        "linears_only_ms": linears_only_ms(target),
        "modes": {},
    }
    for mode in args.modes.split(","):
        with modes.engine_mode(mode, longest + 10) as m:
            row: dict = {}
            before = slots.compile_events()
            t0 = time.perf_counter()
            if mode == "compiled":  # build the graphs the curve and the loops use, timed apart
                kv = modes.row_kv(target, 1, context + 10)
                kv.warm(list(range(1, 10)))
                seq_cache = modes.SeqCache(draft)
                seq_cache.slots.warm([1, 5, 7])
            row["compile_s"] = time.perf_counter() - t0
            curve = forward_curve_ms(target, context, list(range(1, 10)), args.repeats + 2)
            row["t_target_ms"] = median(curve[0])
            row["verify_ms"] = [median(c) for c in curve[1:]]
            row["roofline_share"] = step_bytes / (row["t_target_ms"] / 1e3) / 1e9 / copy_gbps
            row["t_draft_ms_lean"] = measure_t_draft_ms(ModelDrafter(draft, "lean"), seq, args.repeats + 2)
            row["t_draft_ms_mode_cache"] = measure_t_draft_ms(
                ModelDrafter(draft, "mode", lean=False), seq, args.repeats + 2
            )
            entries = []
            for name, gamma in CONFIGS:
                spec = parse_draft(name)
                entries.append(Entry(build_drafter(spec, target, {"draft-1l": draft}), gamma))
            measure_many(target, entries, s.case, 1)  # untimed pass: every graph exists now
            row["graphs_built"] = slots.compile_events() - before
            loop_before = slots.compile_events()
            measured = measure_many(target, entries, s.case, args.repeats)
            row["recompiles_in_timed_loop"] = slots.compile_events() - loop_before
            row["speedups"] = {
                f"{name} γ{gamma}": {
                    "speedup": ms.metrics.speedup,
                    "tokens_per_s": ms.metrics.tokens_per_s,
                    "baseline_tokens_per_s": ms.metrics.baseline_tokens_per_s,
                    "mismatches": ms.mismatches,
                }
                for (name, gamma), ms in zip(CONFIGS, measured, strict=True)
            }
            row["fallbacks"] = list(m.fallbacks)
            report["modes"][mode] = row
            print(json.dumps({mode: row}, indent=1), flush=True)
    eager = report["modes"].get("eager", {}).get("t_target_ms")
    if eager:
        for row in report["modes"].values():
            row["t_target_vs_eager"] = row["t_target_ms"] / eager
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
