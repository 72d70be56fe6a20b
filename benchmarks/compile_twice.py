"""`bench --engine compiled` twice on a tiny non-Llama (GPT-2) pair: no compile in the timing.

Issue 21: a compile inside the timed region made `bench --engine compiled` report 0.18x on a
GPT-2 pair. Here a GPT-2 target (--layers blocks) and a 1-block draft made of the target's
first block (tied embeddings: they agree often) are saved with a word-level tokenizer, then the
same `specdec-tune bench --engine compiled` runs twice, each in a fresh process (the second
finds the first's inductor cache on disk). Each call's speedup, graphs and compile seconds
(reported apart, untimed) are recorded; the goal is two speedups within 10 % of each other.

    python benchmarks/compile_twice.py            # ~3-6 min on a 2-core CPU
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def make_pair(folder: Path, layers: int, hidden: int, vocab: int, prompts: int, seed: int) -> dict[str, str]:
    """Save a GPT-2 target, its 1-block draft and a workload JSONL under `folder`."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    torch.manual_seed(seed)
    cfg = dict(
        vocab_size=vocab, n_embd=hidden, n_head=4, n_positions=512, bos_token_id=0, eos_token_id=vocab - 1
    )
    target = GPT2LMHeadModel(GPT2Config(n_layer=layers, **cfg)).eval()
    draft = GPT2LMHeadModel(GPT2Config(n_layer=1, **cfg)).eval()
    own = draft.state_dict()
    draft.load_state_dict({k: v for k, v in target.state_dict().items() if k in own})
    words = {f"w{i}": i for i in range(vocab)}
    tk = Tokenizer(models.WordLevel(vocab=words, unk_token="w1"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, eos_token=f"w{vocab - 1}", pad_token="w0", unk_token="w1"
    )
    paths = {}
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(folder / name)
        tok.save_pretrained(folder / name)
        paths[name] = str(folder / name)
    g = torch.Generator().manual_seed(seed)
    lines = []
    for i in range(prompts):
        ids = torch.randint(2, vocab - 1, (6 + 3 * i,), generator=g).tolist()
        lines.append(json.dumps({"prompt": " ".join(f"w{t}" for t in ids)}))
    (folder / "workload.jsonl").write_text("\n".join(lines) + "\n")
    paths["workload"] = str(folder / "workload.jsonl")
    return paths


def bench_once(paths: dict[str, str], args: argparse.Namespace, env: dict[str, str]) -> dict:
    cmd = [
        sys.executable,
        "-c",
        "from specdec_tune.cli import main; main()",
        "bench",
        "--target",
        paths["target"],
        "--draft",
        paths["draft"],
        "--workload",
        paths["workload"],
        "--engine",
        "compiled",
        "--device",
        "cpu",
        "-g",
        str(args.gamma),
        "--repeats",
        str(args.repeats),
        "--max-new-tokens",
        str(args.max_new_tokens),
        "--no-per-category",
        "--json",
    ]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.timeout)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"bench failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    r = json.loads(done.stdout)
    return {
        "speedup": r["speedup"],
        "speedups": r["speedups"],
        "mismatches": r["mismatches"],
        "compile": r.get("compile"),
        "wall_s": round(wall, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/compile_twice.json"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        paths = make_pair(folder, args.layers, args.hidden, args.vocab, args.prompts, 0)
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor")}
        calls = [bench_once(paths, args, env) for _ in range(2)]
    a, b = calls[0]["speedup"], calls[1]["speedup"]
    diff = abs(a - b) / max(a, b)
    result = {
        "pair": f"GPT-2 target {args.layers}x{args.hidden} / 1-block draft, vocab {args.vocab}",
        "settings": {k: getattr(args, k) for k in ("prompts", "max_new_tokens", "gamma", "repeats")},
        "machine": {"cpu": platform.processor() or platform.machine(), "torch": torch.__version__},
        "calls": calls,
        "relative_difference": round(diff, 4),
        "agree_within_10pct": diff <= 0.10,
    }
    for i, c in enumerate(calls, 1):
        built = c["compile"] or {}
        print(
            f"call {i}: speedup {c['speedup']:.3f}x (repeats {', '.join(f'{x:.3f}' for x in c['speedups'])}), "
            f"{built.get('graphs')} graphs in {built.get('compile_s')} s before timing, "
            f"{built.get('graphs_in_timing')} inside timing, {c['mismatches']} mismatches, {c['wall_s']} s wall"
        )
    print(f"difference {diff * 100:.1f}%: {'agree' if diff <= 0.10 else 'DISAGREE'} within 10%")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
