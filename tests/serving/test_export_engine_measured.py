"""A profile measured inside llama.cpp (`run --backend llamacpp`) exports its best to llama.cpp as
it ran, whatever its draft kind: the stored flags are the config. Before, an `ngram-mod` best (a
kind only llama.cpp serves) was said to be impossible in llama.cpp, with SGLang's trie text, and
an alternative was exported instead."""

from __future__ import annotations

from helpers import make_sample_profile

from specdec_tune.domain import DraftSpec
from specdec_tune.serving.capabilities import blockers
from specdec_tune.serving.export import export
from specdec_tune.store.schema import BackendInfo

FLAGS = ["--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "24", "--spec-ngram-mod-n-min", "1",
         "--spec-ngram-mod-n-max", "12"]  # fmt: skip


def _ngram_mod_profile(backend: str | None = "llamacpp"):
    p = make_sample_profile()
    p.best.config.draft = DraftSpec(name="ngram-mod:24", kind="ngram_mod", ngram_max=24, min_draft=1)
    p.best.config.gamma, p.best.config.threshold = 12, 0.0
    if backend is not None:
        p.backend = BackendInfo(backend, {"binary_sha256": "ab12"}, 2)
        p.best.backend_args = ["-m", "t.gguf", *FLAGS]
    return p


def test_an_engine_only_best_measured_in_llamacpp_exports_to_llamacpp_as_it_ran():
    p = _ngram_mod_profile()
    r = export(p, "llamacpp")
    assert r.exported is p.best and not r.fallback
    assert r.settings == FLAGS
    assert " ".join(FLAGS) in r.text and not any("cannot run" in w for w in r.warnings)


def test_an_engine_only_kind_blocks_other_engines_with_its_own_reason():
    p = _ngram_mod_profile()
    (why,) = blockers(p.best.config, "vllm", "llamacpp")
    assert why == "vLLM has no counterpart of llama.cpp's ngram-mod drafter"
    assert blockers(p.best.config, "llamacpp", "llamacpp") == []
    assert blockers(p.best.config, "llamacpp", None) != []  # not measured there: not known to run
    r = export(p, "sglang")
    assert r.exported is not p.best and "ngram-mod" in (r.nothing + " ".join(r.warnings))
