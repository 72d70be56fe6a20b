"""Export of the best config to HF, vLLM, llama.cpp and SGLang settings, with warnings for gaps.

Golden files hold the exact stdout for the sample profile; regenerate them after an intended change
with `UPDATE_GOLDEN=1 pytest tests/test_export.py` and review the diff.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest
from helpers import make_sample_profile

from specdec_tune.errors import SpecDecError
from specdec_tune.output.export import ENGINES, NO_SPECULATION, export_profile, export_settings

GOLDEN = Path(__file__).parent / "golden"

# the sample's best config: draft model at an HF folder, γ=4, t=0.3, greedy
SAMPLE_WARNINGS = {
    "hf": ["scikit-learn"],
    "vllm": ["vLLM has no draft confidence threshold: t=0.3 dropped"],
    "llamacpp": ["llama.cpp loads GGUF files"],
    "sglang": ["SGLang has no draft confidence early stop: t=0.3 dropped"],
}


@pytest.mark.parametrize("engine", ENGINES)
def test_sample_profile_matches_golden(engine):
    text, warnings = export_profile(make_sample_profile(), engine)
    golden = GOLDEN / f"export_{engine}.txt"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(text + "\n", encoding="utf-8")
    assert text + "\n" == golden.read_text(encoding="utf-8")
    assert len(warnings) == len(SAMPLE_WARNINGS[engine])
    for got, expected in zip(warnings, SAMPLE_WARNINGS[engine], strict=True):
        assert expected in got


def test_hf_draft_model_settings_go_on_the_assistant_generation_config():
    settings, _ = export_settings(make_sample_profile(), "hf")
    assert settings["generate_kwargs"] == {
        "assistant_model": "/models/Llama-3.2-1B-Instruct",
        "do_sample": False,
    }
    assert settings["assistant_model.generation_config"] == {
        "num_assistant_tokens": 4,
        "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": 0.3,
    }


def test_hf_writes_threshold_zero_explicitly_because_its_default_is_not_zero():
    settings, warnings = export_settings(make_sample_profile(threshold=0.0), "hf")
    assert settings["assistant_model.generation_config"]["assistant_confidence_threshold"] == 0.0
    assert warnings == []


def test_hf_sampling_workload_sets_do_sample_and_temperature():
    p = make_sample_profile()
    p.workload.temperature = 0.7
    settings, _ = export_settings(p, "hf")
    assert settings["generate_kwargs"]["do_sample"] is True
    assert settings["generate_kwargs"]["temperature"] == 0.7


def test_hf_prompt_lookup():
    p = make_sample_profile(kind="prompt_lookup", threshold=0.0)
    p.best.config.draft.ngram_min = 2
    settings, warnings = export_settings(p, "hf")
    assert settings == {
        "generate_kwargs": {"prompt_lookup_num_tokens": 4, "max_matching_ngram_size": 3, "do_sample": False}
    }
    assert len(warnings) == 1 and "ngram_min=2 has no equivalent" in warnings[0]
    # with ngram_min 1 HF's fallback down to 1-grams is exactly ours: nothing to warn about
    assert export_settings(make_sample_profile(kind="prompt_lookup", threshold=0.0), "hf")[1] == []


def test_hf_layer_skip_uses_assistant_early_exit():
    settings, warnings = export_settings(make_sample_profile(kind="layer_skip", threshold=0.0), "hf")
    assert settings["generate_kwargs"] == {"assistant_early_exit": 8, "do_sample": False}
    assert settings["model.generation_config"]["num_assistant_tokens"] == 4
    assert warnings == []


@pytest.mark.parametrize("engine", ["vllm", "llamacpp", "sglang"])
def test_layer_skip_has_no_equivalent_outside_hf(engine):
    text, warnings = export_profile(make_sample_profile(kind="layer_skip"), engine)
    assert text == ""
    assert len(warnings) == 1 and "no layer-skip self-speculation" in warnings[0]


@pytest.mark.parametrize("engine", ENGINES)
def test_no_speculation_profile(engine):
    text, warnings = export_profile(make_sample_profile(kind="none"), engine)
    assert text == ("{}" if engine == "hf" else "")
    assert warnings == [NO_SPECULATION]
    assert "do not speculate" in NO_SPECULATION


def test_vllm_lines_agree_and_parse():
    text, _ = export_profile(make_sample_profile(), "vllm")
    first, second = text.splitlines()
    flag, value = shlex.split(second)
    assert flag == "--speculative-config"
    assert json.loads(value) == json.loads(first)
    assert json.loads(first) == {
        "method": "draft_model",
        "model": "/models/Llama-3.2-1B-Instruct",
        "num_speculative_tokens": 4,
    }


def test_vllm_prompt_lookup_is_ngram_method():
    settings, warnings = export_settings(make_sample_profile(kind="prompt_lookup", threshold=0.0), "vllm")
    assert settings == {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_max": 3,
        "prompt_lookup_min": 1,
    }
    assert warnings == []


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_no_threshold_warning_when_threshold_is_zero(engine):
    _, warnings = export_profile(make_sample_profile(threshold=0.0), engine)
    assert not any("threshold" in w or "early stop" in w for w in warnings)


def test_llamacpp_threshold_maps_to_draft_p_min_even_when_zero():
    p = make_sample_profile(threshold=0.0)
    p.best.config.draft.path = "/models/draft q8.gguf"
    text, warnings = export_profile(p, "llamacpp")
    assert shlex.split(text) == [
        "-md", "/models/draft q8.gguf", "--draft-max", "4", "--draft-min", "0", "--draft-p-min", "0",
    ]  # fmt: skip
    assert warnings == []  # a .gguf path needs no conversion hint


def test_llamacpp_prompt_lookup_warns_about_the_fixed_ngram_size():
    text, warnings = export_profile(make_sample_profile(kind="prompt_lookup", threshold=0.0), "llamacpp")
    assert text == "--spec-type ngram-simple --spec-ngram-size-n 3 --spec-ngram-size-m 4 --draft-max 4"
    assert any("ngram_min 1" in w for w in warnings)
    assert any("llama-lookup" in w for w in warnings)


def test_sglang_ngram_counts_the_root_token():
    text, warnings = export_profile(make_sample_profile(kind="prompt_lookup", threshold=0.0), "sglang")
    args = shlex.split(text)
    assert args[:2] == ["--speculative-algorithm", "NGRAM"]
    assert args[args.index("--speculative-num-draft-tokens") + 1] == "5"
    assert args[args.index("--speculative-ngram-max-match-window-size") + 1] == "3"
    assert any("CUDA only" in w for w in warnings)


def test_unknown_engine_lists_the_choices():
    with pytest.raises(SpecDecError, match="hf, vllm, llamacpp, sglang"):
        export_profile(make_sample_profile(), "tensorrt")


def test_engine_name_is_case_insensitive():
    assert export_profile(make_sample_profile(), "VLLM") == export_profile(make_sample_profile(), "vllm")
