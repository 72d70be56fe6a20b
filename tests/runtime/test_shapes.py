"""Shapes: the bundled configs are the published architectures (sizes counted on the meta device,
nothing allocated), a tiny one builds on the CPU with seeded, finite random weights and no
tokenizer, and `shape:NAME` references resolve, or fail with the known names."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import tiny_llama, tiny_tokenizer, write_shape

from specdec_tune.errors import SpecDecError
from specdec_tune.runtime.models.loading import LoadedModel, check_vocab_compatible, eos_ids, load_model
from specdec_tune.runtime.models.shapes import (
    bundled_shapes,
    load_shape,
    shape_config,
    shape_name,
    shape_num_params,
)
from specdec_tune.runtime.session import has_random_weights, load_models, parse_draft

# Parameter counts from the model cards (Llama 3.1/3.2, Qwen2.5), in billions.
PUBLISHED_B = {
    "llama-3.1-8b": 8.03,
    "llama-3.2-1b": 1.24,
    "llama-3.2-3b": 3.21,
    "qwen2.5-0.5b": 0.49,
    "qwen2.5-1.5b": 1.54,
    "qwen2.5-7b": 7.61,
    "qwen2.5-32b": 32.5,
}


def test_the_issue_asks_for_these_shapes():
    assert {"llama-3.1-8b", "llama-3.2-1b", "qwen2.5-7b", "qwen2.5-0.5b"} <= set(bundled_shapes())
    assert set(bundled_shapes()) == set(PUBLISHED_B)


@pytest.mark.parametrize("name", sorted(PUBLISHED_B))
def test_bundled_config_is_the_published_size(name):
    from transformers import PretrainedConfig

    config = shape_config(f"shape:{name}")
    assert isinstance(config, PretrainedConfig)
    assert config.model_type == name.split("-")[0].replace("2.5", "2")  # llama / qwen2
    assert config.dtype == torch.bfloat16
    n = shape_num_params(name)
    assert abs(n / 1e9 - PUBLISHED_B[name]) / PUBLISHED_B[name] < 0.02, n


def test_exact_known_sizes():
    # Both published to the parameter: a config that is off anywhere (heads, tying, MLP) misses these.
    assert shape_num_params("llama-3.1-8b") == 8_030_261_248
    assert shape_num_params("qwen2.5-0.5b") == 494_032_768


def test_tiny_shape_builds_on_cpu_with_finite_seeded_weights(tmp_path):
    path = write_shape(tmp_path, "tiny")
    state = torch.random.get_rng_state()
    a = load_shape(f"shape:{path}", "cpu", "float32")
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's random stream is untouched
    b = load_model(f"shape:{path}", "cpu", "float32")  # the loader's way in
    assert isinstance(a, LoadedModel) and a.tokenizer is None
    assert (a.name, a.shape, a.weights, a.dtype) == ("shape:tiny", "tiny", "random", "float32")
    assert a.num_params == b.num_params > 0
    for pa, pb in zip(a.model.parameters(), b.model.parameters(), strict=True):
        assert torch.equal(pa, pb)
    x = torch.randint(0, 96, (1, 16))
    with torch.inference_mode():
        logits = a.model(input_ids=x).logits
    assert torch.isfinite(logits).all() and logits.float().std() > 0
    assert eos_ids(a) == [a.model.config.eos_token_id]  # from the config alone: there is no tokenizer


def test_dtype_is_built_in_not_cast(tmp_path):
    m = load_shape(f"shape:{write_shape(tmp_path, 'tiny')}", "cpu", "bfloat16")
    assert {p.dtype for p in m.model.parameters()} == {torch.bfloat16} and m.dtype == "bfloat16"


def test_shape_by_folder_and_names(tmp_path):
    folder = tmp_path / "My-Model"
    folder.mkdir()
    write_shape(folder, "config")
    assert shape_name(f"shape:{folder}") == "my-model"
    assert shape_name("shape:llama-3.1-8b") == "llama-3.1-8b"
    assert shape_name(str(write_shape(tmp_path, "Tiny.V2"))) == "tiny.v2"


@pytest.mark.parametrize("ref", ["shape:nope", "shape:", "shape:llama-3.1-8B"])
def test_unknown_shape_lists_the_bundled_ones(ref):
    with pytest.raises(SpecDecError, match=r"unknown shape .*llama-3\.1-8b, llama-3\.2-1b"):
        shape_config(ref)
    with pytest.raises(SpecDecError, match="unknown shape"):
        parse_draft(ref)  # a draft fails when parsed, before anything is loaded


@pytest.mark.parametrize(
    ("content", "needle"),
    [("{", "cannot read"), ("[1]", "no model_type"), ('{"model_type": "nonsense-arch"}', "not a config")],
)
def test_bad_shape_files(tmp_path, content, needle):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(SpecDecError, match=needle):
        load_shape(f"shape:{path}", "cpu")


def test_draft_references():
    d = parse_draft("shape:llama-3.2-1b")
    assert (d.name, d.kind, d.path) == ("shape:llama-3.2-1b", "model", "shape:llama-3.2-1b")
    assert has_random_weights(d) and not has_random_weights(parse_draft("prompt-lookup"))
    h = parse_draft("hybrid:prompt-lookup+shape:llama-3.2-1b")
    assert h.kind == "hybrid" and h.path == "shape:llama-3.2-1b" and has_random_weights(h)


def test_vocabularies_without_a_tokenizer_compare_by_size(tmp_path):
    target = load_shape(f"shape:{write_shape(tmp_path, 't', vocab=1000)}", "cpu")
    padded = load_shape(f"shape:{write_shape(tmp_path, 'p', layers=1, vocab=1008)}", "cpu")
    check_vocab_compatible(target, padded)  # padding, as in Qwen2.5-7B against 0.5B
    other = load_shape(f"shape:{write_shape(tmp_path, 'o', layers=1, vocab=1200)}", "cpu")
    with pytest.raises(SpecDecError, match="same model family"):
        check_vocab_compatible(target, other)
    trained = LoadedModel("real", "", None, tiny_llama(layers=1), tiny_tokenizer(), "float32", "cpu")
    tiny = load_shape(f"shape:{write_shape(tmp_path, 'd', layers=1)}", "cpu")
    check_vocab_compatible(trained, tiny)  # a trained target against a shape draft
    with pytest.raises(SpecDecError, match="same model family"):
        check_vocab_compatible(trained, other)


def test_sessions_refuse_shapes_unless_profiling(tmp_path):
    path = f"shape:{write_shape(tmp_path, 'tiny')}"
    with pytest.raises(SpecDecError, match="only `specdec-tune profile`"):
        load_models(path, ["prompt-lookup"], device="cpu")
    s = load_models(path, [path], device="cpu", allow_random=True)
    assert s.case is None and s.target.weights == "random" and "shape:tiny" in s.drafts


def test_configs_are_plain_architecture_json():
    from specdec_tune.runtime.models.shapes import SHAPES_DIR

    for f in SHAPES_DIR.glob("*.json"):
        data = json.loads(f.read_text())
        assert data["torch_dtype"] == "bfloat16" and "tie_word_embeddings" in data
        assert not any(k in data for k in ("_name_or_path", "quantization_config", "auto_map")), f
