"""GGUF tools: cut_layers on synthetic GGUFs (raw tensors, metadata, refusals), and the demo pair
converted to GGUF: metadata, tokenizer, weights, a transformers round trip and the cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import write_tiny_gguf

from specdec_tune.errors import SpecDecError
from specdec_tune.runtime.decode import autoregressive_generate
from specdec_tune.runtime.models.ggufs import (
    cut_layers,
    demo_gguf_paths,
    demo_to_gguf,
    demo_weights_key,
    gguf_block_count,
    gguf_cache_dir,
)
from specdec_tune.runtime.models.loading import eos_ids, load_model
from specdec_tune.runtime.workloads import encode_prompts, load_workload

gguf = pytest.importorskip("gguf")


def _fields(path):
    r = gguf.GGUFReader(path)
    return {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}


def _tensors(path):
    return {t.name: t for t in gguf.GGUFReader(path).tensors}


@pytest.mark.parametrize("tied", [False, True])
def test_cut_layers_keeps_the_first_blocks_raw(tmp_path, tied):
    src = write_tiny_gguf(tmp_path / "src.gguf", blocks=4, tied=tied)
    dst = cut_layers(src, tmp_path / "cut.gguf", 2)

    before, after = _tensors(src), _tensors(dst)
    outside = {"token_embd.weight", "output_norm.weight"} | (set() if tied else {"output.weight"})
    assert set(after) == outside | {f"blk.{i}.{n}.weight" for i in (0, 1) for n in ("attn_q", "attn_norm")}
    assert ("output.weight" in after) is not tied
    for name, t in after.items():
        assert t.tensor_type == before[name].tensor_type
        assert list(t.shape) == list(before[name].shape)
        assert np.array_equal(t.data, before[name].data)
    assert after["blk.0.attn_q.weight"].tensor_type == gguf.GGMLQuantizationType.Q8_0

    meta_before, meta_after = _fields(src), _fields(dst)
    assert meta_after["llama.block_count"] == 2 == gguf_block_count(dst)
    assert meta_after["llama.attention.sliding_window_pattern"] == [1, 0]  # per-layer array cut too
    for key in set(meta_before) - {"llama.block_count", "llama.attention.sliding_window_pattern"}:
        assert meta_after[key] == meta_before[key], key
    assert set(meta_after) == set(meta_before)


@pytest.mark.parametrize("layers", [0, 4, 9])
def test_cut_layers_refuses_layers_outside_the_model(tmp_path, layers):
    src = write_tiny_gguf(tmp_path / "src.gguf", blocks=4)
    with pytest.raises(SpecDecError, match=r"--layers must be between 1 and 3 \(src.gguf has 4 blocks\)"):
        cut_layers(src, tmp_path / "cut.gguf", layers)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src.gguf"]  # no output, no temp file


def test_cut_layers_refuses_a_missing_or_foreign_file(tmp_path):
    with pytest.raises(SpecDecError, match="does not exist"):
        cut_layers(tmp_path / "none.gguf", tmp_path / "cut.gguf", 1)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(SpecDecError, match="not a readable GGUF"):
        cut_layers(bad, tmp_path / "cut.gguf", 1)


def test_cut_layers_replaces_an_existing_output(tmp_path):
    src = write_tiny_gguf(tmp_path / "src.gguf", blocks=4)
    dst = tmp_path / "cut.gguf"
    dst.write_bytes(b"old")
    cut_layers(src, dst, 3)
    assert gguf_block_count(dst) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.gguf", "src.gguf"]


@pytest.fixture(scope="module")
def draft_gguf(tmp_path_factory):
    return demo_to_gguf("draft", tmp_path_factory.mktemp("gguf") / "demo-draft.gguf")


def test_demo_gguf_holds_the_tokenizer_and_the_weights(draft_gguf):
    hf = load_model("draft-1l")
    meta, tensors = _fields(draft_gguf), _tensors(draft_gguf)
    assert meta["general.architecture"] == "llama" and meta["llama.block_count"] == 1
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "gpt-2"
    vocab = hf.tokenizer.get_vocab()
    assert meta["tokenizer.ggml.tokens"] == sorted(vocab, key=vocab.get)
    assert meta["tokenizer.ggml.token_type"][:3] == [3, 3, 1]  # <|endoftext|>, <|pad|>: control
    assert len(meta["tokenizer.ggml.merges"]) == 3838
    assert meta["tokenizer.ggml.eos_token_id"] == 0 and meta["tokenizer.ggml.add_bos_token"] is False
    assert "output.weight" not in tensors  # tied embeddings stay tied
    embed = hf.model.get_input_embeddings().weight.detach().numpy()
    assert np.array_equal(tensors["token_embd.weight"].data, embed)
    assert tensors["blk.0.attn_q.weight"].tensor_type == gguf.GGMLQuantizationType.F32


def test_demo_gguf_round_trips_through_transformers(draft_gguf):
    """transformers undoes llama.cpp's q/k layout on load: the same logits and greedy tokens."""
    from transformers import AutoModelForCausalLM

    hf = load_model("draft-1l")
    back = AutoModelForCausalLM.from_pretrained(
        draft_gguf.parent, gguf_file=draft_gguf.name, dtype=torch.float32
    )
    prompts = encode_prompts(load_workload("demo-code"), hf.tokenizer)[:2]
    with torch.inference_mode():
        ids = torch.tensor([prompts[0]])
        assert torch.allclose(back(ids).logits, hf.model(ids).logits, atol=1e-4)
    for p in prompts:
        want = autoregressive_generate(hf.model, p, 24, eos=eos_ids(hf)).tokens
        assert autoregressive_generate(back, p, 24, eos=eos_ids(hf)).tokens == want


def test_demo_to_gguf_refuses_unknown_names(tmp_path):
    with pytest.raises(SpecDecError, match="unknown demo model 'big'"):
        demo_to_gguf("big", tmp_path / "x.gguf")
    with pytest.raises(SpecDecError, match="use f32 or f16"):
        demo_to_gguf("draft", tmp_path / "x.gguf", "q4")


def test_demo_gguf_paths_writes_once_per_weights(tmp_path):
    paths = demo_gguf_paths(tmp_path)
    assert set(paths) == {"target", "draft"}
    assert paths["target"] == tmp_path / demo_weights_key() / "demo-target.gguf"
    assert gguf_block_count(paths["target"]) == 6 and gguf_block_count(paths["draft"]) == 1
    stamps = {k: p.stat().st_mtime_ns for k, p in paths.items()}
    assert demo_gguf_paths(tmp_path) == paths
    assert {k: p.stat().st_mtime_ns for k, p in paths.items()} == stamps  # nothing rewritten


def test_gguf_cache_dir_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert gguf_cache_dir() == tmp_path / "specdec-tune" / "gguf"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert gguf_cache_dir() == tmp_path / "home" / ".cache" / "specdec-tune" / "gguf"
