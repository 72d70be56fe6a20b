"""What several test modules share: tiny models and tokenizers built in memory, the CLI runner,
and a realistic, fully filled Profile (an 8B target with a 1B draft on one H200).

`make_sample_profile(kind=..., gamma=..., threshold=...)` swaps the best config's drafter; any other
keyword replaces the Profile field of that name. Numbers have at most 5 significant digits, so a
save/load round trip is exact.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from specdec_tune.cli import app
from specdec_tune.domain import Config, Costs, DraftCosts, DraftSpec, Metrics, Result
from specdec_tune.store.schema import Profile, SearchInfo, TargetInfo, WorkloadInfo

BASELINE_TOK_S = 144.93

DRAFTS = {
    "model": DraftSpec(name="llama-3.2-1b", kind="model", path="/models/Llama-3.2-1B-Instruct"),
    "prompt_lookup": DraftSpec(name="lookup", kind="prompt_lookup", ngram_min=1, ngram_max=3),
    "layer_skip": DraftSpec(name="skip-8l", kind="layer_skip", layers=8),
    "none": DraftSpec(name="none", kind="none"),
}


def make_metrics(speedup: float, acceptance: float, tau: float, per_position: list[float]) -> Metrics:
    return Metrics(
        tokens_per_s=round(BASELINE_TOK_S * speedup, 2),
        baseline_tokens_per_s=BASELINE_TOK_S,
        speedup=speedup,
        speedup_spread=0.031,
        acceptance_rate=acceptance,
        mean_accepted_len=tau,
        per_position_acceptance=per_position,
        repeats=3,
        predicted_speedup=round(speedup * 0.97, 4) if acceptance > 0 else None,
    )


def make_costs() -> Costs:
    return Costs(
        t_target_ms=6.9,
        t_target_spread=0.012,
        verify_ms=[7.1, 7.2, 7.3, 7.4, 7.6, 7.7, 7.9, 8.1],
        verify_spread=0.024,
        context_len=512,
        loop_overhead_ms=0.21,
        step_overhead_ms=0.38,
        drafts=[
            DraftCosts(
                name="llama-3.2-1b",
                t_draft_ms=2.6,
                c=0.37681,
                acceptance_rate=0.73,
                acceptance_vector=[0.82, 0.78, 0.75, 0.72, 0.7, 0.68, 0.66, 0.64],
            ),
            DraftCosts(
                name="lookup",
                t_draft_ms=0.05,
                c=0.0072464,
                acceptance_rate=0.21,
                acceptance_vector=[0.12, 0.35, 0.45, 0.5, 0.52, 0.54, 0.55, 0.55],
            ),
            DraftCosts(
                name="skip-8l",
                t_draft_ms=3.3,
                c=0.47826,
                acceptance_rate=0.62,
                acceptance_vector=[0.71, 0.66, 0.62, 0.6, 0.58, 0.56, 0.54, 0.52],
            ),
        ],
        copy_bandwidth_gbps=3950.2,
        decode_bandwidth_gbps=2310.7,
        roofline_share=0.58496,
        matmul_tflops=612.4,
    )


def make_result(kind: str, gamma: int, threshold: float, speedup: float) -> Result:
    draft = dataclasses.replace(DRAFTS[kind])
    if kind == "none":
        return Result(Config(draft, 0, 0.0), make_metrics(1.0, 0.0, 1.0, []))
    per_position = [0.82, 0.78, 0.75, 0.72, 0.7, 0.68, 0.66, 0.64][:gamma]
    return Result(Config(draft, gamma, threshold), make_metrics(speedup, 0.7412, 3.12, per_position))


def make_sample_profile(
    kind: str = "model", gamma: int = 4, threshold: float = 0.3, **overrides: Any
) -> Profile:
    """A complete profile whose best config uses drafter `kind`; `overrides` replace Profile fields."""
    best = make_result(kind, gamma, threshold, 1.3102)
    if kind != "none":
        best.metrics.search_speedup = 1.3517  # re-measured in the final round
    profile = Profile(
        hardware={
            "kind": "cuda",
            "slug": "nvidia-h200",
            "gpu_name": "NVIDIA H200",
            "compute_capability": "9.0",
            "gpu_memory_gb": 139.8,
            "sm_count": 132,
            "cuda": "12.8",
            "driver": "570.86.15",
            "cpu_model": "Intel(R) Xeon(R) Platinum 8480+",
            "physical_cores": 16,
        },
        target=TargetInfo(
            name="meta-llama/Llama-3.1-8B-Instruct",
            path="/models/Llama-3.1-8B-Instruct",
            revision="0e9e39f249a16976918f6564b8830bc894c89659",
            content_hash="5c1f0d8a9e3b7d42",
            dtype="bfloat16",
            num_params=8030261248,
        ),
        workload=WorkloadInfo(
            name="chat-mix", prompts=64, sha256="a3f09c1d2e4b5867", max_new_tokens=128, temperature=0.0
        ),
        costs=make_costs(),
        search=SearchInfo(
            sampler="tpe",
            trials=40,
            failed=1,
            pruned=6,
            study_name="llama-3.1-8b-instruct@nvidia-h200",
            storage="sqlite:///specdec-tune.db",
            seed=0,
            finalists=3,
            final_repeats=4,
            space={
                "drafts": ["llama-3.2-1b", "lookup", "skip-8l"],
                "gamma": [1, 8],
                "threshold": [0.0, 0.6],
            },
        ),
        best=best,
        alternatives=[
            make_result("model", 5, 0.2, 1.2871),
            make_result("model", 3, 0.0, 1.2503),
            make_result("layer_skip", 3, 0.0, 1.0412),
            make_result("prompt_lookup", 4, 0.0, 0.9811),
        ],
        baseline=Metrics(
            tokens_per_s=BASELINE_TOK_S,
            baseline_tokens_per_s=BASELINE_TOK_S,
            speedup=1.0,
            speedup_spread=0.018,
            acceptance_rate=0.0,
            mean_accepted_len=1.0,
            per_position_acceptance=[],
            repeats=3,
            predicted_speedup=None,
        ),
        versions={
            "specdec_tune": "0.1.0",
            "torch": "2.13.0",
            "transformers": "5.24.0",
            "optuna": "4.5.0",
            "python": "3.11.7",
        },
        created="2025-11-29T10:00:00Z",
    )
    return dataclasses.replace(profile, **overrides)


# ------------------------------------------------------------------------- tiny models

VOCAB = 96


def tiny_llama(layers: int = 3, hidden: int = 64, vocab: int = VOCAB, seed: int = 0, init: float = 0.3):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        intermediate_size=hidden * 2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=init,
        eos_token_id=vocab - 1,
        bos_token_id=0,
        pad_token_id=0,
    )
    return LlamaForCausalLM(cfg).eval()


def noisy_copy(model, noise: float, seed: int = 1):
    """A draft that agrees with the target often but not always: its weights plus noise."""
    import copy

    draft = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g) * noise * p.std().clamp_min(1e-3))
    return draft.eval()


def tiny_tokenizer(vocab: int = VOCAB):
    """A word-level tokenizer: token id i is the word w{i}; w0 pads, the last id ends a sequence."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"w{i}": i for i in range(vocab)}
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token="w1"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=f"w{vocab - 1}", pad_token="w0", unk_token="w1"
    )


def save_pair(folder, target, draft, vocab: int = VOCAB):
    """Save target and draft with the tiny tokenizer as loadable model folders."""
    tok = tiny_tokenizer(vocab)
    paths = {}
    for name, model in (("target", target), ("draft", draft)):
        p = folder / name
        model.save_pretrained(p)
        tok.save_pretrained(p)
        paths[name] = str(p)
    return paths


# ------------------------------------------------------------- exactness against generate


def hf_greedy(model, prompt, max_new, eos):
    ids = torch.tensor([prompt])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=0,
    )
    new = out[0, len(prompt) :].tolist()
    if eos is not None and eos in new:
        new = new[: new.index(eos) + 1]
    return new


def near_tie(model, prompt, got, want) -> bool:
    """Whether the first differing token is a near-tie of the target (top-2 within 1e-4 relative),
    where batched matmuls may legitimately round the other way."""
    i = next(i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b)
    device = next(model.parameters()).device  # a model on CUDA (tests/runtime/test_cuda.py)
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + want[:i]], device=device)).logits[0, -1].double()
    top2 = logits.topk(2).values
    return float(top2[0] - top2[1]) <= 1e-4 * float(top2[0].abs().clamp_min(1e-12))


def check_rows(model, case, outputs, reference) -> int:
    """Asserts every row matches its reference or differs at a proven near-tie; returns the ties."""
    ties = 0
    for prompt, got, want in zip(case.prompts, outputs, reference, strict=True):
        if got != want:
            assert near_tie(model, prompt, got, want), (prompt, got, want)
            ties += 1
    return ties


# ------------------------------------------------------------------------------ the CLI

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def tiny_args(d, *extra):
    return ["--target", d["target"], "--workload", d["workload"], "--device", "cpu", *extra]


def one_red_line(result) -> None:
    """Exit 2 and exactly one error line (a yellow warning the run printed before, e.g. about a
    noisy machine, is not part of the error)."""
    # CliRunner catches a traceback into result.exception (it never reaches result.output): only
    # the SystemExit of the error handler may end the command
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    err = "\n".join(line for line in lines if not line.startswith("warning:"))
    assert err.startswith("error:") and "\n" not in err, result.stderr
    assert "Traceback" not in result.output


def a_verdict(result) -> int:
    """`check` re-measured and gave a verdict: 0 pass, 1 regression or 6 inconclusive, never a
    crash or a bad-input exit; its stderr names the verdict its exit code says. One repeat of a tiny
    model on a shared machine may honestly be any of the three (CI failed once on a test that
    allowed only 0 and 1: the machine's own speed moved 25 % between `run` and `check`)."""
    assert isinstance(result.exception, SystemExit | None), repr(result.exception)
    assert result.exit_code in (0, 1, 6), result.output
    assert (result.exit_code == 1) == ("regression:" in result.stderr), result.stderr
    assert (result.exit_code == 6) == ("inconclusive:" in result.stderr), result.stderr
    return result.exit_code


# ------------------------------------------------------------------------ tiny shapes


def write_shape(folder, name: str, layers: int = 2, vocab: int = VOCAB, hidden: int = 64):
    """A tiny Llama `config.json`-style shape file (no weights) -> its path, for `shape:PATH`."""
    import json
    from pathlib import Path

    path = Path(folder) / f"{name}.json"
    config = {
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": hidden * 2,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": vocab,
        "max_position_embeddings": 1024,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    path.write_text(json.dumps(config, indent=2) + "\n")
    return path


def write_tiny_gguf(path, blocks: int = 4, tied: bool = False):
    """A synthetic Llama GGUF: quantised (Q8_0) and F32 block tensors, an F16 head unless `tied`,
    a per-layer metadata array and a token list. Returns the path."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_block_count(blocks)
    w.add_embedding_length(32)
    w.add_head_count(2)
    w.add_key_value(
        "llama.attention.sliding_window_pattern", [1, 0] * (blocks // 2), gguf.GGUFValueType.ARRAY
    )
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(64)])
    w.add_tensor("token_embd.weight", rng.standard_normal((64, 32), dtype=np.float32))
    for i in range(blocks):
        q = gguf.quants.quantize(
            rng.standard_normal((32, 32), dtype=np.float32), gguf.GGMLQuantizationType.Q8_0
        )
        w.add_tensor(f"blk.{i}.attn_q.weight", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.full(32, i, dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(32, dtype=np.float32))
    if not tied:
        w.add_tensor("output.weight", rng.standard_normal((64, 32)).astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def fast_subset(values, fast):
    """Parameters of an exactness matrix with all but the `fast` values marked slow: the fast tier
    (`pytest -m "not slow"`) keeps one representative per family, the full suite runs every value."""
    return [v if v in fast else pytest.param(v, marks=pytest.mark.slow) for v in values]


def documented_fields(cls: type) -> set[str]:
    """The fields of dataclass `cls` followed by a docstring in its source (a policy's rule)."""
    body = ast.parse(inspect.getsource(cls)).body[0].body
    return {
        stmt.target.id
        for stmt, nxt in itertools.pairwise(body)
        if isinstance(stmt, ast.AnnAssign)
        and isinstance(nxt, ast.Expr)
        and isinstance(nxt.value, ast.Constant)
    }
