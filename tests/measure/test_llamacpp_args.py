"""llama.cpp's drafts and flags (no binary needed): what a config asks llama-server to run."""

from __future__ import annotations

import pytest

from specdec_tune.domain import Config
from specdec_tune.errors import SpecDecError
from specdec_tune.measure.llamacpp.args import parse_llamacpp_draft, server_args, spec_args


def flags(text: str, gamma: int, threshold: float = 0.0, path: str | None = None) -> dict[str, str]:
    argv = spec_args(Config(parse_llamacpp_draft(text), gamma, threshold), path)
    assert len(argv) % 2 == 0, argv
    return dict(zip(argv[::2], argv[1::2], strict=True))


def test_ngram_simple_drafts_gamma_tokens_after_an_n_token_match():
    f = flags("ngram-simple:4", 6)
    assert f["--spec-type"] == "ngram-simple"
    assert f["--spec-ngram-simple-size-n"] == "4"
    assert f["--spec-ngram-simple-size-m"] == "6"
    # ngram-simple's draft length is size-m: --spec-draft-n-max would do nothing, so it is not passed
    assert "--spec-draft-n-max" not in f


def test_spec_draft_n_max_is_passed_only_to_the_types_that_read_it(tmp_path):
    assert "--spec-draft-n-max" not in flags("ngram-mod:12", 5)  # its own --spec-ngram-mod-n-max
    g = tmp_path / "d.gguf"
    g.write_bytes(b"GGUF")
    assert flags(str(g), 4)["--spec-draft-n-max"] == "4"
    hybrid = flags("hybrid:ngram-simple:3+layer-skip:2", 5, path="/c/first2.gguf")
    assert hybrid["--spec-draft-n-max"] == "5"  # its draft-simple half reads it


def test_ngram_mod_sets_its_own_range_and_keeps_n_min_within_gamma():
    f = flags("ngram-mod:12:8", 5)
    assert f["--spec-type"] == "ngram-mod"
    assert f["--spec-ngram-mod-n-match"] == "12"
    assert f["--spec-ngram-mod-n-max"] == "5"
    assert f["--spec-ngram-mod-n-min"] == "5"  # 8 > gamma: llama.cpp would never draft
    assert flags("ngram-mod", 3)["--spec-ngram-mod-n-match"] == "24"


def test_draft_model_with_p_min(tmp_path):
    g = tmp_path / "d.gguf"
    g.write_bytes(b"GGUF")
    f = flags(str(g), 4, 0.3)
    assert f["--spec-type"] == "draft-simple"
    assert f["--spec-draft-model"] == str(g)
    assert f["--spec-draft-p-min"] == "0.3"
    assert f["--spec-draft-n-max"] == "4"


def test_layer_skip_runs_the_cut_it_is_given_and_a_hybrid_lists_both_types():
    assert flags("layer-skip:3", 2, path="/c/first3.gguf")["--spec-draft-model"] == "/c/first3.gguf"
    with pytest.raises(SpecDecError, match="no GGUF"):
        flags("layer-skip:3", 2)
    f = flags("hybrid:ngram-simple:3+layer-skip:2", 4, path="/c/first2.gguf")
    assert f["--spec-type"] == "ngram-simple,draft-simple"
    assert f["--spec-ngram-simple-size-n"] == "3"


def test_plain_server_has_no_speculative_flags():
    assert spec_args(Config(parse_llamacpp_draft("ngram-simple"), 0), None) == []
    argv = server_args("t.gguf", 512, 4)
    assert argv[:2] == ["-m", "t.gguf"] and "-np" in argv and "--spec-type" not in argv
    assert argv[argv.index("-c") + 1] == str(512 * 4)  # every slot gets the whole context


@pytest.mark.parametrize(
    "bad", ["ngram-simple:0", "ngram-mod:2000", "prompt-lookup", "hybrid:ngram-mod+x.gguf", "missing.gguf"]
)
def test_unknown_or_out_of_range_drafts_are_user_errors(bad):
    with pytest.raises(SpecDecError):
        parse_llamacpp_draft(bad)


@pytest.mark.parametrize("kind", ["k", "k4v"])
def test_the_ngram_maps_draft_gamma_tokens_after_an_n_token_key(kind):
    """llama.cpp's ngram-map-k (one value per key) and ngram-map-k4v (four): size-n is the key,
    size-m the draft length, under their own flags (common/arg.cpp, build 11434)."""
    f = flags(f"ngram-map-{kind}:5", 7)
    assert f["--spec-type"] == f"ngram-map-{kind}"
    assert f[f"--spec-ngram-map-{kind}-size-n"] == "5"
    assert f[f"--spec-ngram-map-{kind}-size-m"] == "7"
    spec = parse_llamacpp_draft(f"ngram-map-{kind}")
    assert (spec.name, spec.kind, spec.ngram_max) == (f"ngram-map-{kind}:4", f"ngram_map_{kind}", 4)


def test_ngram_cache_runs_at_the_length_llamacpp_fixes():
    """ngram-cache takes no setting and drafts up to 8 tokens: measured at γ 8, refused at any other."""
    assert spec_args(Config(parse_llamacpp_draft("ngram-cache"), 8)) == ["--spec-type", "ngram-cache"]
    with pytest.raises(SpecDecError, match="always drafts up to 8"):
        spec_args(Config(parse_llamacpp_draft("ngram-cache"), 4))


def test_every_flag_of_the_new_kinds_is_in_the_current_flag_set():
    from specdec_tune.serving.flagcheck import problems
    from specdec_tune.serving.flagsets import flagset

    for text, gamma in (("ngram-map-k:3", 6), ("ngram-map-k4v:6", 12), ("ngram-cache", 8)):
        assert problems(flagset("llamacpp"), spec_args(Config(parse_llamacpp_draft(text), gamma))) == []


def test_a_server_killed_at_start_up_names_the_signal_and_for_an_illegal_instruction_the_cure():
    import signal

    from specdec_tune.measure.llamacpp.server import died_of

    assert died_of(None) == "" and died_of(1) == "" and died_of(0) == ""
    assert died_of(-signal.SIGKILL) == " (killed by SIGKILL)"
    ill = died_of(-signal.SIGILL)
    assert ill.startswith(" (killed by SIGILL; ") and "-mno-amx-tile" in ill and ill.endswith(")")
    assert "CMAKE_ARGS" in died_of(-signal.SIGSEGV)
