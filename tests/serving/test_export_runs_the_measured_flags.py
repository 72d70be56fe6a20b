"""`export --to llamacpp` emits the flags its config's measured server was started with: one mapping
(`measure.llamacpp.args.spec_args`), for every llama.cpp draft kind, with and without a threshold,
at B = 1 and 4. Before, export rebuilt the flags with a mapping of its own that wrote every n-gram
kind as ngram-simple."""

from __future__ import annotations

import pytest
from helpers import make_sample_profile

from specdec_tune.domain import Config
from specdec_tune.errors import SpecDecError
from specdec_tune.measure.llamacpp.args import parse_llamacpp_draft, server_args
from specdec_tune.serving.export import export
from specdec_tune.store.schema import BackendInfo

# (--draft as `run --backend llamacpp` takes it, γ, threshold); GGUF stands for a draft GGUF file
DRAFTS = [
    ("ngram-simple:3", 4, 0.0),
    ("ngram-map-k:4", 6, 0.0),
    ("ngram-map-k4v:4", 6, 0.0),
    ("ngram-mod:12:2", 8, 0.0),
    ("ngram-cache", 8, 0.0),
    ("GGUF", 5, 0.0),
    ("GGUF", 5, 0.3),
    ("layer-skip:2", 3, 0.0),
    ("layer-skip:2", 3, 0.25),
    ("hybrid:ngram-simple:3+GGUF", 6, 0.0),
    ("hybrid:ngram-simple:3+GGUF", 6, 0.4),
]


def _without_context(argv: list[str]) -> list[str]:
    """A measured server's flags less what export leaves to the deployment: `-c` (the measured
    context x slots) and `--no-webui`."""
    i = argv.index("-c")
    return [a for a in argv[:i] + argv[i + 2 :] if a != "--no-webui"]


@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize(("draft", "gamma", "threshold"), DRAFTS)
def test_the_exported_command_runs_what_the_measured_server_ran(
    tmp_path, draft, gamma, threshold, batch_size
):
    gguf = tmp_path / "draft-q8.gguf"
    gguf.write_bytes(b"GGUF")
    config = Config(parse_llamacpp_draft(draft.replace("GGUF", str(gguf))), gamma, threshold)
    # The backend runs a layer-skip draft as a GGUF it cut from the target (its `draft_paths`); the
    # profile names that cut as the draft's path, so export resolves the same file.
    cut = str(tmp_path / "first2.gguf") if config.draft.kind == "layer_skip" else None
    config.draft.path = cut or config.draft.path
    p = make_sample_profile()
    p.best.config = config
    # measured there, no flags stored (before, export then emitted no speculative flag at all)
    p.backend = BackendInfo("llamacpp", {"number": 11434})
    assert p.best.backend_args == []
    # The measured server loads the target GGUF the backend found; export names the profile's target
    # path, so the measured side is given that same string as its model.
    ran = server_args(p.target.path, 512, batch_size, config, cut)
    r = export(p, "llamacpp", batch_size=batch_size)
    assert r.exported is p.best and not r.fallback
    assert r.argv[0] == "llama-server" and r.lead == 1
    assert r.argv[1:] == _without_context(ran)  # -m, -np B, then every speculative flag, in order
    assert r.settings == ran[ran.index("--no-webui") + 1 :]
    # Stored beside the config (as `run --backend llamacpp` does), the same flags come out.
    p.best.backend_args = ran
    assert export(p, "llamacpp", batch_size=batch_size).settings == r.settings


def test_an_ngram_range_exports_as_the_one_length_llamacpp_runs_and_says_so():
    # a profile of our engine: prompt lookup n = 1..3 runs in llama.cpp as ngram-simple n = 3
    p = make_sample_profile(kind="prompt_lookup", threshold=0.0)
    r = export(p, "llamacpp")
    cfg = p.best.config
    one = Config(parse_llamacpp_draft(f"ngram-simple:{cfg.draft.ngram_max}"), cfg.gamma)
    assert r.settings == server_args("t.gguf", 512, 1, one)[7:]
    assert any("matches one n-gram length (n = ngram_max 3)" in w for w in r.warnings)


def test_a_kind_an_older_build_has_no_flags_for_is_one_clear_error():
    p = make_sample_profile()
    p.best.config = Config(parse_llamacpp_draft("ngram-mod:12"), 8)
    p.backend = BackendInfo("llamacpp", {"number": 11434})
    assert "--spec-ngram-mod-n-max" in export(p, "llamacpp").settings
    with pytest.raises(SpecDecError, match="flag set b8955 cannot run ngram-mod:12"):
        export(p, "llamacpp", "b8955")
