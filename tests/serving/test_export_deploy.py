"""Deployments from the batch table: the schedule is safe to ship (noise merge, the K = 0 rule, the
engines' field rules), batch settings come from the table, `--no-schedule --batch-size B` picks the
operating point for that load, and llama.cpp's mapping can be fed the flags a backend measured."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

import pytest
from helpers import invoke, make_sample_profile

from specdec_tune.domain import NO_DRAFT, Config, Result
from specdec_tune.measure.llamacpp.args import spec_args
from specdec_tune.serving.export import export
from specdec_tune.serving.flagcheck import problems
from specdec_tune.serving.flagsets import flagset
from specdec_tune.serving.llamacpp_args import llamacpp_args, measured_llamacpp_args
from specdec_tune.store.schema import BackendInfo, BatchRow

EPYC = Path(__file__).parents[1] / "data" / "profiles" / "cpu-amd-epyc-2t" / "demo.yaml"


def _at(result, gamma=None, speedup=None, spread=None):
    config = dataclasses.replace(result.config, gamma=result.config.gamma if gamma is None else gamma)
    metrics = dataclasses.replace(result.metrics)
    if speedup is not None:
        metrics.speedup = speedup
    if spread is not None:
        metrics.speedup_spread = spread
    return Result(config, metrics)


def _plain(profile):
    return Result(Config(NO_DRAFT, 0), dataclasses.replace(profile.baseline))


def batched(rows, b_star=None):
    """The sample profile (draft model γ=4 t=0) with batch table rows (B, result)."""
    p = make_sample_profile(threshold=0.0)
    p.batch_table = [BatchRow(b, r, [r] if r.config.draft.kind != "none" else []) for b, r in rows]
    p.b_star = b_star
    return p


def resolved():
    """γ4 1.30x at B=1, γ2 1.15x at B=16 (spreads 3 %), plain decoding from B* = 64."""
    p = make_sample_profile(threshold=0.0)
    best = p.best
    return batched(
        [(1, _at(best, speedup=1.30)), (16, _at(best, gamma=2, speedup=1.15)), (64, _plain(p))], b_star=64
    )


def _ranges_follow_the_field_rules(schedule):
    assert schedule[0][0] == 1
    for i, (start, end, k) in enumerate(schedule):
        assert start <= end and k >= 0
        if i:
            assert start == schedule[i - 1][1] + 1  # sorted, non-overlapping, no gap


def test_vllm_schedule_follows_the_field_rules_and_says_what_vllm_does_with_it():
    r = export(resolved(), "vllm")
    schedule = r.settings["num_speculative_tokens_per_batch_size"]
    assert schedule == [[1, 15, 4], [16, 65536, 2]]  # no K = 0 tier: vLLM's costs more than plain
    _ranges_follow_the_field_rules(schedule)
    assert problems(flagset("vllm"), r.settings) == []
    assert any("PIECEWISE" in w and "data parallelism > 1" in w for w in r.warnings)
    assert any("B* = 64" in w and "7-17 %" in w for w in r.warnings)


def test_a_difference_within_the_noise_exports_no_switch():
    p = make_sample_profile(threshold=0.0)
    best = p.best
    # γ4 at B=1 1.30x ± 0.13, γ2 at B=8 1.26x ± 0.126: 0.04x apart, within either range
    close = batched(
        [(1, _at(best, speedup=1.30, spread=0.1)), (8, _at(best, gamma=2, speedup=1.26, spread=0.1))]
    )
    r = export(close, "vllm")
    assert "num_speculative_tokens_per_batch_size" not in r.settings
    assert r.settings["num_speculative_tokens"] == 4
    assert any(
        "no switch from K = 4 to K = 2 at batch size 8" in w and "within the noise" in w for w in r.warnings
    )
    # the same table with tight repeats resolves the difference: the switch stays
    tight = batched(
        [(1, _at(best, speedup=1.30, spread=0.01)), (8, _at(best, gamma=2, speedup=1.26, spread=0.01))]
    )
    assert export(tight, "vllm").settings["num_speculative_tokens_per_batch_size"] == [
        [1, 7, 4],
        [8, 65536, 2],
    ]


def test_measured_k0_that_pays_is_exported_with_the_warning_text():
    p = resolved()
    row = p.batch_table[-1]
    row.per_draft = [_at(p.best, gamma=0, speedup=1.02)]  # the draft measured at K = 0 there: it paid
    r = export(p, "vllm")
    assert r.settings["num_speculative_tokens_per_batch_size"][-1] == [64, 65536, 0]
    assert any("K = 0 tier" in w and "PIECEWISE" in w for w in r.warnings)


def test_trtllm_schedule_keys_are_upper_bounds_and_k0_is_the_implicit_tier_with_its_warning():
    r = export(resolved(), "trtllm")
    spec = r.settings["speculative_config"]
    assert spec["draft_len_schedule"] == {15: 4, 63: 2} and spec["max_draft_len"] == 4
    assert problems(flagset("trtllm"), r.settings) == []
    assert any("K = 0 from batch size 64" in w for w in r.warnings)
    bad = {"speculative_config": {**spec, "max_draft_len": 3}}
    assert any("must equal" in x for x in problems(flagset("trtllm"), bad))
    both = {"speculative_config": {**spec, "max_concurrency": 8}}
    assert any("exclude each other" in x for x in problems(flagset("trtllm"), both))


def test_no_schedule_with_a_batch_size_emits_the_operating_point_for_that_load():
    r = export(resolved(), "vllm", batch_size=20, schedule=False)
    assert r.settings == {"method": "draft_model", "model": r.settings["model"], "num_speculative_tokens": 2}
    args = shlex.split(export(resolved(), "llamacpp", batch_size=16).text)
    assert args[args.index("-np") + 1] == "16" and args[args.index("--spec-draft-n-max") + 1] == "2"
    gone = export(resolved(), "sglang", batch_size=64)
    assert gone.exported is None and "plain decoding was fastest at batch size 64" in gone.nothing


def test_committed_profile_sizes_llamacpp_and_sglang_from_the_batch_table():
    r = invoke("export", EPYC, "--to", "llamacpp")
    assert r.exit_code == 0
    args = shlex.split(r.stdout)
    # Its batch table (1, 4, 16): speculation won at every measured batch size, so the server is
    # sized for the largest one (B* is covered by the synthetic profiles above).
    assert args[:2] == ["llama-server", "-m"] and args[args.index("-np") + 1] == "16"
    assert "-np 16: the largest measured batch size where speculation won here" in r.stderr
    sg = shlex.split(invoke("export", EPYC, "--to", "sglang").stdout)
    assert sg[sg.index("--max-running-requests") + 1] == "16"
    j = invoke("export", EPYC, "--to", "trtllm", "--format", "json")
    assert '"draft_len_schedule"' in j.stdout and '"load": 16' in j.stdout


def test_hf_note_is_not_garbled():
    r = export(resolved(), "hf")
    assert any(
        w.startswith("HF's assisted generation runs one sequence per generate() call") for w in r.warnings
    )
    assert not any("below it" in w for w in r.warnings)


def test_llamacpp_ngram_exports_the_flags_its_server_was_started_with():
    # ngram-simple:3 γ=4: the draft length is --spec-ngram-simple-size-m; --spec-draft-n-max does
    # nothing there, so neither the measuring server nor the export passes it
    p = make_sample_profile(kind="prompt_lookup", threshold=0.0)
    p.best.config.draft.ngram_min = p.best.config.draft.ngram_max = 3
    args = export(p, "llamacpp").settings
    assert args == [
        "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "4",
    ]  # fmt: skip
    assert args == spec_args(p.best.config)  # what the llamacpp backend starts llama-server with
    assert export(p, "llamacpp", fmt="flags").settings == args  # round 2, unchanged
    old = export(p, "llamacpp", "b8955").settings  # builds b8955-b9463: as exported before
    assert old[old.index("--spec-draft-n-max") + 1] == "4"


def test_a_stored_n_max_the_spec_type_does_not_read_is_kept_with_a_note():
    ran = ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-m", "6", "--spec-draft-n-max", "6"]
    p = make_sample_profile(kind="prompt_lookup", threshold=0.0)
    args, notes = llamacpp_args(p.best.config, flagset("llamacpp"), "", measured=ran)
    assert args == ran  # an exported config is one that ran
    assert any(n.startswith("--spec-draft-n-max is kept as the server ran with it") for n in notes)
    hybrid = ["--spec-type", "ngram-simple,draft-simple", "--spec-draft-n-max", "6"]
    _, notes = llamacpp_args(p.best.config, flagset("llamacpp"), "", measured=hybrid)
    assert not any("--spec-draft-n-max is kept" in n for n in notes)


def test_ngram_mod_and_parallel_slots_are_in_the_current_flag_set():
    argv = ["-m", "t.gguf", "-np", "4", "--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "24"]
    assert (
        problems(flagset("llamacpp"), [*argv, "--spec-ngram-mod-n-min", "48", "--spec-ngram-mod-n-max", "64"])
        == []
    )
    assert any(
        "needs --spec-type" in x for x in problems(flagset("llamacpp"), ["--spec-ngram-mod-n-max", "8"])
    )
    assert any("not a valid int" in x for x in problems(flagset("llamacpp"), ["-np", "0"]))


def test_stored_llamacpp_flags_are_emitted_exactly():
    ran = ["-m", "t.gguf", "--port", "8081", "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "2"]
    stored = measured_llamacpp_args({"name": "llamacpp", "build": {"number": 11434}}, ran)
    assert stored == ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "2"]
    assert measured_llamacpp_args({"name": "native"}, ran) is None
    p = make_sample_profile(kind="prompt_lookup", threshold=0.0)
    args, notes = llamacpp_args(p.best.config, flagset("llamacpp"), "", measured=stored)
    assert args == stored and "measured" in notes[0]


def test_trtllm_prompt_lookup_keeps_the_measured_match_policy_and_a_private_pool():
    p = make_sample_profile(kind="prompt_lookup", threshold=0.0)
    spec = export(p, "trtllm").settings["speculative_config"]
    assert (
        spec["decoding_type"] == "NGram"
        and spec["is_use_oldest"] is False
        and spec["is_public_pool"] is False
    )
    p.best.config.draft.lookup_match = "earliest"
    assert export(p, "trtllm").settings["speculative_config"]["is_use_oldest"] is True


@pytest.mark.parametrize("fmt", ["command", "json", "flags"])
def test_cli_formats(fmt):
    r = invoke("export", EPYC, "--to", "vllm", "--format", fmt)
    assert r.exit_code == 0, r.output
    assert invoke("export", EPYC, "--to", "vllm", "--format", "yaml").exit_code == 2


def test_llamacpp_backend_profiles_export_the_threads_they_were_measured_with():
    p = make_sample_profile(kind="prompt_lookup", threshold=0.0)
    p.backend = BackendInfo("llamacpp", {"number": 11434}, 1)
    r = export(p, "llamacpp")
    args = shlex.split(r.text)
    assert args[args.index("-t") + 1] == "1" and args[args.index("-tb") + 1] == "1"
    assert any(w.startswith("-t 1 -tb 1: the CPU threads") for w in r.warnings)
    assert problems(flagset("llamacpp"), args[1:]) == []
    # llama.cpp's own default measured (no --threads), or a native profile: nothing to add.
    p.backend = BackendInfo("llamacpp", {"number": 11434}, None)
    assert "-t" not in shlex.split(export(p, "llamacpp").text)
    p.backend = BackendInfo()
    assert "-t" not in shlex.split(export(p, "llamacpp").text)


def test_hf_exports_the_batch_size_1_row_it_says_applies():
    # resolved(): γ4 at B = 1, γ2 at B = 16; HF runs one sequence per generate() call
    r = export(resolved(), "hf")
    assert r.settings["assistant_model.generation_config"]["num_assistant_tokens"] == 4
    assert r.load == 1 and any("B = 1 row is what applies" in w for w in r.warnings)
    asked = export(resolved(), "hf", batch_size=16)
    assert asked.settings["assistant_model.generation_config"]["num_assistant_tokens"] == 4
    assert any("--batch-size 16 does not change the HF export" in w for w in asked.warnings)


def test_a_batch_size_beyond_the_table_names_the_batch_size_it_was_measured_at():
    best = make_sample_profile(threshold=0.0).best
    p = batched([(1, _at(best, speedup=1.30)), (16, _at(best, gamma=2, speedup=1.15))])
    r = export(p, "llamacpp", batch_size=32)
    args = shlex.split(r.text)
    assert args[args.index("-np") + 1] == "32"
    assert any(
        "--batch-size 32 is beyond what was measured" in w and "batch size 16 at most" in w
        for w in r.warnings
    )
    assert any("measured at batch size 16" in w for w in export(p, "vllm", batch_size=32).warnings)
    assert not any("beyond what was measured" in w for w in export(p, "llamacpp", batch_size=16).warnings)
    # without a batch table the profile was measured one request at a time
    single = export(make_sample_profile(threshold=0.0), "sglang", batch_size=8)
    assert any("measured at batch size 1 at most" in w for w in single.warnings)
