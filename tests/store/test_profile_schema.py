"""The profile schema: lossless YAML round trip, atomic writes, and clear errors for broken files."""

from __future__ import annotations

import copy
import dataclasses
import os
import re

import pytest
import yaml
from helpers import make_sample_profile
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_tune import atomic
from specdec_tune.atomic import atomic_write_text
from specdec_tune.domain import Config, DraftSpec
from specdec_tune.errors import SpecDecError
from specdec_tune.store import yamlio
from specdec_tune.store.schema import SCHEMA_VERSION, Profile
from specdec_tune.store.validate import profile_from_dict
from specdec_tune.store.yamlio import load_profile, profile_to_dict, profile_to_yaml, save_profile

KINDS = ["model", "prompt_lookup", "layer_skip", "none"]


def _files(folder):
    return sorted(p.name for p in folder.iterdir())


def _write_modified(tmp_path, edit) -> str:
    """Save the sample profile as a dict, let `edit` break it, write it back; returns the path."""
    data = profile_to_dict(make_sample_profile())
    edit(data)
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return str(path)


def _load_error(path) -> str:
    with pytest.raises(SpecDecError) as info:
        load_profile(path)
    return str(info.value)


# ------------------------------------------------------------------------------------ round trip


@pytest.mark.parametrize("kind", KINDS)
def test_round_trip_is_lossless_for_every_draft_kind(tmp_path, kind):
    p = make_sample_profile(kind=kind)
    path = save_profile(p, tmp_path / "nvidia-h200" / "llama.yaml")
    assert load_profile(path) == p


def test_round_trip_without_costs(tmp_path):
    p = make_sample_profile(costs=None)
    assert load_profile(save_profile(p, tmp_path / "p.yaml")) == p


def test_yaml_is_readable_header_field_order_and_inline_number_lists(tmp_path):
    text = save_profile(make_sample_profile(), tmp_path / "p.yaml").read_text(encoding="utf-8")
    assert text.startswith("# specdec-tune profile — meta-llama/Llama-3.1-8B-Instruct on nvidia-h200")
    top_keys = [line.split(":")[0] for line in text.splitlines() if re.match(r"^[a-z0-9_]+:", line)]
    assert top_keys == [f.name for f in dataclasses.fields(Profile)]
    assert "verify_ms: [7.1, 7.2, 7.3, 7.4, 7.6, 7.7, 7.9, 8.1]" in text
    # strings that YAML would otherwise read as numbers or dates stay quoted
    assert "created: '2025-11-29T10:00:00Z'" in text
    assert "compute_capability: '9.0'" in text


def test_floats_are_rounded_to_five_significant_digits():
    p = make_sample_profile()
    p.best.metrics.speedup = 1.234567891
    p.costs.drafts[0].c = 0.000123456789
    d = profile_to_dict(p)
    assert d["best"]["metrics"]["speedup"] == 1.2346
    assert d["costs"]["drafts"][0]["c"] == 0.00012346


@settings(max_examples=30, deadline=None)
@given(
    speedup=st.floats(min_value=0.0, max_value=50.0, allow_nan=False),
    acceptance=st.floats(min_value=0.0, max_value=1.0),
    gamma=st.integers(min_value=1, max_value=32),
)
def test_round_trip_keeps_values_to_written_precision(speedup, acceptance, gamma):
    p = make_sample_profile(gamma=gamma)
    p.best.metrics.speedup = speedup
    p.best.metrics.acceptance_rate = acceptance
    q = profile_from_dict(yaml.safe_load(profile_to_yaml(p)))
    assert q.best.config.gamma == gamma
    assert q.best.metrics.speedup == pytest.approx(speedup, rel=1e-4, abs=1e-12)
    assert q.best.metrics.acceptance_rate == pytest.approx(acceptance, rel=1e-4, abs=1e-12)
    # a second trip changes nothing: rounding is idempotent
    assert profile_from_dict(yaml.safe_load(profile_to_yaml(q))) == q


def test_labels():
    p = make_sample_profile()
    assert p.best.config.label == "llama-3.2-1b γ=4 t=0.30"
    lookup = DraftSpec(name="lookup", kind="prompt_lookup", ngram_min=1, ngram_max=3)
    assert Config(lookup, 4).label == "lookup γ=4"
    assert lookup.label == "lookup (n=1..3)"
    assert DraftSpec(name="skip", kind="layer_skip", layers=8).label == "skip (8 layers)"
    assert Config(DraftSpec(name="none", kind="none"), 0).label == "no speculation"


# ------------------------------------------------------------------------------------- atomicity


def test_save_creates_parents_and_leaves_no_temp_file(tmp_path):
    folder = tmp_path / "profiles" / "nvidia-h200"
    save_profile(make_sample_profile(), folder / "llama.yaml")
    save_profile(make_sample_profile(gamma=5), folder / "llama.yaml")  # overwrite
    assert _files(folder) == ["llama.yaml"]
    assert load_profile(folder / "llama.yaml").best.config.gamma == 5
    assert oct((folder / "llama.yaml").stat().st_mode & 0o777) == oct(0o644)


def test_failing_yaml_dump_leaves_the_old_file_intact(tmp_path, monkeypatch):
    path = save_profile(make_sample_profile(), tmp_path / "p.yaml")
    before = path.read_bytes()

    def broken_dump(*args, **kwargs):
        raise RuntimeError("disk gremlin")

    monkeypatch.setattr(yamlio.yaml, "dump", broken_dump)
    with pytest.raises(RuntimeError, match="gremlin"):
        save_profile(make_sample_profile(gamma=6), path)
    assert path.read_bytes() == before
    assert _files(tmp_path) == ["p.yaml"]


def test_failing_write_midway_leaves_old_file_and_no_temp(tmp_path, monkeypatch):
    path = save_profile(make_sample_profile(), tmp_path / "p.yaml")
    before = path.read_bytes()

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "replace", broken_replace)
    with pytest.raises(SpecDecError, match="No space left on device"):
        save_profile(make_sample_profile(gamma=6), path)
    assert path.read_bytes() == before
    assert _files(tmp_path) == ["p.yaml"]


def test_invalid_profile_is_never_written(tmp_path):
    p = make_sample_profile()
    p.best.config.gamma = -1
    with pytest.raises(SpecDecError, match=r"best\.config\.gamma"):
        save_profile(p, tmp_path / "p.yaml")
    assert _files(tmp_path) == []


def test_atomic_write_text_keeps_the_mode_of_the_file_it_replaces(tmp_path):
    path = tmp_path / "sub" / "trials.csv"
    atomic_write_text(path, "a,b\n1,2\n")
    assert path.read_text() == "a,b\n1,2\n"
    os.chmod(path, 0o600)
    atomic_write_text(path, "a,b\n3,4\n")
    assert path.read_text() == "a,b\n3,4\n"
    assert path.stat().st_mode & 0o777 == 0o600
    assert _files(path.parent) == ["trials.csv"]


# ---------------------------------------------------------------------------------- broken files


def test_missing_file(tmp_path):
    assert "profile not found" in _load_error(tmp_path / "nope.yaml")


def test_folder_instead_of_file(tmp_path):
    assert "folder" in _load_error(tmp_path)


def test_not_yaml(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("hardware: [1, 2\nbest: {", encoding="utf-8")
    msg = _load_error(path)
    assert "not valid YAML" in msg and "line" in msg


def test_binary_file(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00")
    assert "not a text file" in _load_error(path)


def test_empty_file(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("# only a comment\n", encoding="utf-8")
    assert "empty" in _load_error(path)


def test_not_a_mapping(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("- 1\n- 2\n", encoding="utf-8")
    assert "must be a YAML mapping at the top level, got a list" in _load_error(path)


@pytest.mark.parametrize("fraction", [0.25, 0.5, "baseline"])
def test_truncated_file_names_the_missing_field(tmp_path, fraction):
    full = save_profile(make_sample_profile(), tmp_path / "full.yaml").read_text(encoding="utf-8")
    lines = full.splitlines(keepends=True)
    path = tmp_path / "cut.yaml"
    # "baseline": cut inside the last required section (every field after it is optional)
    cut = lines.index("baseline:\n") + 2 if fraction == "baseline" else int(len(lines) * fraction)
    path.write_text("".join(lines[:cut]), encoding="utf-8")
    msg = _load_error(path)
    assert str(path) in msg
    # the first field that went missing (or was cut to nothing) is named, not the trailing schema_version
    assert re.search(r"profile field '[\w.\[\]]+' (is missing|must be a mapping, got null)", msg)
    assert "schema_version" not in msg


def test_missing_nested_field_is_named(tmp_path):
    path = _write_modified(tmp_path, lambda d: d["best"]["metrics"].pop("speedup"))
    assert "profile field 'best.metrics.speedup' is missing" in _load_error(path)


def test_missing_field_in_a_list_item_is_named(tmp_path):
    path = _write_modified(tmp_path, lambda d: d["alternatives"][2]["config"].pop("gamma"))
    assert "'alternatives[2].config.gamma' is missing" in _load_error(path)


def test_mistyped_gamma(tmp_path):
    path = _write_modified(tmp_path, lambda d: d["best"]["config"].__setitem__("gamma", "x"))
    assert "profile field 'best.config.gamma' must be an int >= 0, got 'x'" in _load_error(path)


def test_the_noise_during_the_search_round_trips_and_a_non_boolean_busy_is_named(tmp_path):
    from specdec_tune.domain import MachineWindow, Noise

    window = MachineWindow(200.5, 1.9, 0.0, 0.41, ["stress (101) 82% of a CPU"], busy=True)
    p = dataclasses.replace(
        make_sample_profile(), noise=Noise(2.0, 0.02, 3, 2, 0.3, 0.0, 0.01, [], 5, during_search=window)
    )
    assert load_profile(save_profile(p, tmp_path / "p.yaml")).noise.during_search == window
    data = profile_to_dict(p)
    data["noise"]["during_search"]["busy"] = "maybe"
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    assert "profile field 'noise.during_search.busy' must be true or false, got 'maybe'" in _load_error(path)


def test_negative_gamma(tmp_path):
    path = _write_modified(tmp_path, lambda d: d["best"]["config"].__setitem__("gamma", -2))
    assert "profile field 'best.config.gamma' must be an int in 1..64, got -2" in _load_error(path)


def test_unknown_draft_kind(tmp_path):
    path = _write_modified(tmp_path, lambda d: d["best"]["config"]["draft"].__setitem__("kind", "eagle"))
    msg = _load_error(path)
    assert (
        "'best.config.draft.kind' must be one of none, model, prompt_lookup, layer_skip, hybrid, ngram_mod, "
        "ngram_map_k, ngram_map_k4v, ngram_cache, got 'eagle'" in msg
    )


def test_model_draft_needs_a_path(tmp_path):
    path = _write_modified(tmp_path, lambda d: d["best"]["config"]["draft"].__setitem__("path", None))
    assert "'best.config.draft.path'" in _load_error(path)


def test_acceptance_out_of_range(tmp_path):
    path = _write_modified(
        tmp_path, lambda d: d["costs"]["drafts"][1]["acceptance_vector"].__setitem__(3, 1.7)
    )
    assert "'costs.drafts[1].acceptance_vector[3]' must be a number in [0, 1], got 1.7" in _load_error(path)


def test_wrong_schema_version(tmp_path):
    path = _write_modified(tmp_path, lambda d: d.__setitem__("schema_version", 3))
    msg = _load_error(path)
    assert "schema_version 3 is not supported" in msg
    assert f"schema version 1 and {SCHEMA_VERSION}" in msg


def test_version_1_profiles_still_load(tmp_path):
    """The committed demo profile was written before the batch table (schema version 1)."""
    from pathlib import Path

    committed = Path(__file__).parents[1] / "data" / "profiles" / "cpu-intel-xeon-2t" / "demo.yaml"
    p = load_profile(committed)
    assert p.schema_version == 1 and p.batch_table == [] and p.b_star is None
    path = _write_modified(tmp_path, lambda d: (d.__setitem__("schema_version", 1), d.pop("batch_table")))
    assert load_profile(path).schema_version == 1


def test_batch_table_round_trips_and_is_validated(tmp_path):
    from specdec_tune.store.schema import BatchRow

    prof = make_sample_profile()
    prof.batch_table = [
        BatchRow(1, prof.best, [prof.best, *prof.alternatives[:1]], 1.9, "s-b1"),
        BatchRow(16, prof.alternatives[0], [], None, "s-b16", confirmed_from="B=1"),
    ]
    prof.b_star, prof.predicted_b_star = 32, 16
    save_profile(prof, tmp_path / "p.yaml")
    assert load_profile(tmp_path / "p.yaml") == prof
    data = profile_to_dict(prof)
    # two equal rows, not one object twice (YAML would write that as an alias, which is refused)
    data["batch_table"] = [data["batch_table"][0], copy.deepcopy(data["batch_table"][0])]
    twice = tmp_path / "twice.yaml"
    twice.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    assert "batch_table[1].batch_size' must not repeat" in _load_error(str(twice))
    # a row that was not searched names the cell it confirmed, and nothing else
    data = profile_to_dict(prof)
    data["batch_table"][1]["confirmed_from"] = "B=1; rm -rf"
    odd = tmp_path / "odd.yaml"
    odd.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    assert "batch_table[1].confirmed_from' must name a cell as B=N or L=N" in _load_error(str(odd))


def test_missing_schema_version(tmp_path):
    path = _write_modified(tmp_path, lambda d: d.pop("schema_version"))
    assert "'schema_version' is missing" in _load_error(path)


def test_unknown_field_is_rejected(tmp_path):
    path = _write_modified(tmp_path, lambda d: d["best"]["config"].__setitem__("gama", 4))
    assert f"'best.config.gama' is not part of schema version {SCHEMA_VERSION}" in _load_error(path)


def test_hardware_needs_a_slug(tmp_path):
    path = _write_modified(tmp_path, lambda d: d["hardware"].pop("slug"))
    assert "'hardware.slug'" in _load_error(path)


def test_unquoted_number_for_a_string_field(tmp_path):
    path = _write_modified(tmp_path, lambda d: d["target"].__setitem__("content_hash", 1234567890))
    assert "'target.content_hash' must be a string (quote it in YAML), got 1234567890" in _load_error(path)


def test_hand_written_unquoted_timestamp_is_accepted(tmp_path):
    text = save_profile(make_sample_profile(), tmp_path / "p.yaml").read_text(encoding="utf-8")
    path = tmp_path / "edited.yaml"
    path.write_text(text.replace("created: '2025-11-29T10:00:00Z'", "created: 2025-11-29T10:00:00Z"))
    assert load_profile(path).created.startswith("2025-11-29T10:00:00")


def test_intervals_and_the_final_verdict_round_trip_and_are_optional(tmp_path):
    p = make_sample_profile()
    p.best.metrics.speedup_samples = [1.28, 1.3, 1.31]
    p.best.metrics.speedup_interval = [1.28, 1.31]
    p.search.final_verdict = "tie within noise"
    p.search.final_margin = [1.01, 0.98, 1.04]
    p.search.outliers = ["draft γ=5 t=0.00"]
    save_profile(p, tmp_path / "p.yaml")
    again = load_profile(tmp_path / "p.yaml")
    assert again.best.metrics.speedup_interval == [1.28, 1.31] and again.search.outliers == p.search.outliers
    assert again.search.final_verdict == "tie within noise" and again.best.metrics.speedup_samples == [
        1.28,
        1.3,
        1.31,
    ]
    # A profile written before these fields loads with none of them.
    old = make_sample_profile()
    assert old.best.metrics.speedup_interval is None and old.search.final_verdict == ""
    bad = _write_modified(tmp_path, lambda d: d["best"]["metrics"].update(speedup_interval=[1.4, 1.2]))
    assert "best.metrics.speedup_interval" in _load_error(bad)


def test_compile_time_round_trips_in_profile_and_costs_and_is_optional(tmp_path):
    from specdec_tune.domain import CompileTime
    from specdec_tune.store.yamlio import costs_to_yaml, load_costs

    p = make_sample_profile()
    p.engine_mode = "compiled"
    p.compile = CompileTime(graphs=17, compile_s=41.25)
    p.costs.compile = CompileTime(graphs=12, compile_s=30.5)
    again = load_profile(save_profile(p, tmp_path / "p.yaml"))
    assert again == p and again.compile == CompileTime(17, 41.25)
    (tmp_path / "c.yaml").write_text(costs_to_yaml(p.costs, p.hardware), encoding="utf-8")
    assert load_costs(tmp_path / "c.yaml")[0].compile == CompileTime(12, 30.5)
    # A profile written before the field (no `compile` key at all) loads with None.
    old = _write_modified(tmp_path, lambda d: (d.pop("compile"), d["costs"].pop("compile")))
    loaded = load_profile(old)
    assert loaded.compile is None and loaded.costs.compile is None
    bad = _write_modified(tmp_path, lambda d: d.__setitem__("compile", {"graphs": 3, "compile_s": -1.0}))
    assert "'compile.compile_s' must be a number >= 0.0" in _load_error(bad)


@pytest.mark.parametrize(
    ("anchor", "error"),
    [
        ({"matrices": [[384, 384]], "dtype": "float32"}, "'anchors.decode_anchor.matrices[0]' must be [rows"),
        ({"matrices": [[384, 0, 2]]}, "'anchors.decode_anchor.matrices[0][1]' must be"),
        ({"matrices": [[2**20, 2**20, 1]]}, "must have at most 268435456 elements"),
        ({"matrices": [[8, 8, 2**15]]}, "must count at most 16384 matrices"),
        ({"matrices": [[8, 8, 1]], "dtype": "int8"}, "'anchors.decode_anchor.dtype' must be one of"),
        ({"matrices": []}, "'anchors.decode_anchor.matrices' must have 1 to"),
    ],
)
def test_the_decode_anchor_round_trips_and_a_bad_one_is_named(tmp_path, anchor, error):
    """A hand-edited decode anchor cannot make `check` allocate or loop without end."""
    from specdec_tune.domain import Anchors, DecodeAnchorSpec

    good = Anchors(100.0, 20.0, 200.0, decode_anchor=DecodeAnchorSpec([[384, 384, 24], [4096, 384, 1]]))
    good.reference_plain_per_anchor = [0.7, 0.71]
    p = dataclasses.replace(make_sample_profile(), anchors=good)
    again = load_profile(save_profile(p, tmp_path / "p.yaml")).anchors
    assert again.decode_anchor == good.decode_anchor and again.has_anchor_reference
    data = profile_to_dict(p)
    data["anchors"]["decode_anchor"] = anchor
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    assert error in _load_error(path)


def test_every_backend_writes_created_in_one_format():
    """`created` is ISO 8601 UTC to the second with an offset, written by one function for the
    native and the llama.cpp use cases (the llama.cpp one wrote a trailing Z)."""
    import re

    from specdec_tune.store.schema import created_now

    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", created_now())
