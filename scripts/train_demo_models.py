"""Train the shipped demo model pair: a byte-level BPE tokenizer, a target and two drafts.

The corpus is the CPython standard library's own ``.py`` sources (code, comments, docstrings),
which every machine with Python has, so the models can be rebuilt offline. The drafts are
distilled from the target (KL to its next-token distribution), which is what makes their
greedy proposals agree with it. Usage::

    python scripts/train_demo_models.py --out specdec_tune/data/demo [--target-steps 600]

Deterministic for a given Python version, seed and thread count (up to float reduction order).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import sysconfig
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

EOS = "<|endoftext|>"
PAD = "<|pad|>"
VOCAB = 4096
SEQ_LEN = 256

# (hidden, layers, intermediate, heads) — sized so the target costs >= 6x the smallest draft per
# decoded token on a 2-core CPU, and the three folders stay under 32 MB in bf16.
SIZES = {
    "target": (384, 6, 1024, 6),
    "draft-2l": (192, 2, 512, 3),
    "draft-1l": (128, 1, 384, 2),
}


def corpus_files() -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "test", "tests", "idle_test", "__pycache__", "lib2to3"}
    files = [p for p in sorted(stdlib.rglob("*.py")) if not skip & set(p.relative_to(stdlib).parts)]
    return files


def read_corpus(files: list[Path]) -> list[str]:
    texts = []
    for p in files:
        try:
            t = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if t.strip():
            texts.append(t)
    return texts


def train_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=[EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, bos_token=EOS, pad_token=PAD, model_max_length=2048
    )


def make_model(name: str, tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    hidden, layers, inter, heads = SIZES[name]
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        num_hidden_layers=layers,
        intermediate_size=inter,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=2048,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(cfg)


def batches(ids: torch.Tensor, batch: int, gen: torch.Generator):
    n = ids.numel() - SEQ_LEN - 1
    while True:
        starts = torch.randint(0, n, (batch,), generator=gen)
        yield torch.stack([ids[s : s + SEQ_LEN] for s in starts.tolist()])


def lr_at(step: int, steps: int, peak: float, warmup: int = 40) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


@torch.no_grad()
def eval_loss(model, val: torch.Tensor, teacher=None) -> float:
    model.eval()
    gen = torch.Generator().manual_seed(1234)
    losses = []
    for x in [next(batches(val, 8, gen)) for _ in range(4)]:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(input_ids=x).logits.float()
        losses.append(F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), x[:, 1:].reshape(-1)).item())
    model.train()
    return sum(losses) / len(losses)


def train(model, train_ids, val_ids, steps, peak_lr, batch, seed, log, teacher=None) -> dict:
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=peak_lr, weight_decay=0.1, betas=(0.9, 0.95))
    model.train()
    it = batches(train_ids, batch, gen)
    t0 = time.time()
    loss_val = float("nan")
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, peak_lr)
        x = next(it)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(input_ids=x).logits.float()
            if teacher is None:
                loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), x[:, 1:].reshape(-1))
            else:
                with torch.no_grad():
                    t_logits = teacher(input_ids=x).logits.float()
                # Distillation: forward KL to the target's next-token distribution.
                loss = F.kl_div(
                    F.log_softmax(logits, -1).reshape(-1, VOCAB),
                    F.log_softmax(t_logits, -1).reshape(-1, VOCAB),
                    log_target=True,
                    reduction="batchmean",
                )
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_val = loss.item()
        if step % 25 == 0 or step == steps - 1:
            log(f"  step {step:4d}/{steps} loss {loss_val:.3f} ({time.time() - t0:.0f}s)")
    model.eval()
    return {
        "steps": steps,
        "final_train_loss": round(loss_val, 4),
        "val_ce": round(eval_loss(model, val_ids), 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("specdec_tune/data/demo"))
    ap.add_argument("--target-steps", type=int, default=600)
    ap.add_argument("--draft-steps", type=int, default=500)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    def log(msg: str) -> None:
        print(msg, flush=True)

    random.seed(args.seed)
    torch.manual_seed(args.seed)
    files = corpus_files()
    texts = read_corpus(files)
    log(f"corpus: {len(texts)} files, {sum(map(len, texts)) / 1e6:.1f} M chars from {files[0].parent}")
    tokenizer = train_tokenizer(texts)
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for enc in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        ids.extend(enc)
        ids.append(eos)
    all_ids = torch.tensor(ids, dtype=torch.long)
    split = int(len(all_ids) * 0.98)
    train_ids, val_ids = all_ids[:split], all_ids[split:]
    log(f"tokens: {len(all_ids) / 1e6:.2f} M (train {split}, val {len(all_ids) - split})")

    provenance = {
        "corpus": f"CPython {sys.version.split()[0]} standard library .py files (no tests, no site-packages)",
        "corpus_files": len(texts),
        "corpus_tokens": len(all_ids),
        "corpus_license": "Python Software Foundation License",
        "tokenizer": f"byte-level BPE, vocab {VOCAB}",
        "seq_len": SEQ_LEN,
        "batch": args.batch,
        "seed": args.seed,
        "torch": torch.__version__,
        "models": {},
    }

    torch.manual_seed(args.seed)
    target = make_model("target", tokenizer)
    log(f"target: {sum(p.numel() for p in target.parameters()) / 1e6:.1f} M params")
    stats = train(target, train_ids, val_ids, args.target_steps, 2e-3, args.batch, args.seed, log)
    provenance["models"]["target"] = {"objective": "next-token cross-entropy", **stats}
    save(target, tokenizer, args.out / "target")
    log(f"target done: {stats}")

    for name in ("draft-1l", "draft-2l"):
        torch.manual_seed(args.seed + 1)
        draft = make_model(name, tokenizer)
        log(f"{name}: {sum(p.numel() for p in draft.parameters()) / 1e6:.2f} M params")
        stats = train(
            draft, train_ids, val_ids, args.draft_steps, 3e-3, args.batch, args.seed + 1, log, teacher=target
        )
        provenance["models"][name] = {"objective": "KL distillation from target", **stats}
        save(draft, tokenizer, args.out / name)
        log(f"{name} done: {stats}")

    for name, (h, layers, inter, heads) in SIZES.items():
        provenance["models"][name]["config"] = {
            "hidden": h,
            "layers": layers,
            "intermediate": inter,
            "heads": heads,
        }
    (args.out / "provenance.json").write_text(json.dumps(provenance, indent=2) + "\n")
    log("done")


def save(model, tokenizer, path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    # Shards of at most 15 MB: no tracked file over 20 MB (the target is 24 MB in bf16).
    model.to(torch.bfloat16).save_pretrained(path, safe_serialization=True, max_shard_size="15MB")
    model.float()
    tokenizer.save_pretrained(path)


if __name__ == "__main__":
    main()
