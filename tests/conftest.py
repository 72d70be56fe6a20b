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
