"""Shared fixtures: tiny offline model pairs built in memory and saved to temp folders."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

torch = pytest.importorskip("torch")
# Tiny models gain nothing from intra-op threads, and threads make tests slow on a busy 2-core box.
torch.set_num_threads(1)

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


@pytest.fixture(scope="session")
def tiny_target():
    return tiny_llama()


@pytest.fixture(scope="session")
def tiny_draft(tiny_target):
    return noisy_copy(tiny_target, 0.02)


@pytest.fixture(scope="session")
def prompts():
    g = torch.Generator().manual_seed(7)
    out = [torch.randint(1, VOCAB - 1, (n,), generator=g).tolist() for n in (1, 5, 12, 30)]
    # A repetitive prompt so prompt lookup finds matches.
    out.append([5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7])
    return out


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


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory, tiny_target, tiny_draft):
    """Folders: target, draft (agrees often), other-vocab draft, and a workload JSONL."""
    import json

    root = tmp_path_factory.mktemp("models")
    paths = save_pair(root, tiny_target, tiny_draft)
    other = tiny_llama(layers=1, vocab=80, seed=3)
    p = root / "other"
    other.save_pretrained(p)
    tiny_tokenizer(80).save_pretrained(p)
    paths["other"] = str(p)
    g = torch.Generator().manual_seed(11)
    lines = []
    for n in (6, 9, 4):
        ids = torch.randint(2, VOCAB - 1, (n,), generator=g).tolist()
        lines.append(json.dumps({"prompt": " ".join(f"w{i}" for i in ids), "category": "test"}))
    wl = root / "workload.jsonl"
    wl.write_text("\n".join(lines) + "\n")
    paths["workload"] = str(wl)
    return paths
