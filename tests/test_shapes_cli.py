"""Shape-only profiling end to end: `profile --shape` on tiny random-weight shapes writes a costs
file that says its weights were random, takes acceptance from `--acceptance-vector` or an
earlier file (or leaves it unknown, predicting nothing), and bad input is one red line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from helpers import invoke, make_costs, make_sample_profile, one_red_line, write_shape

from specdec_tune.backends.acceptance import acceptance_plan, apply_acceptance, parse_given
from specdec_tune.domain import DraftCosts
from specdec_tune.errors import SpecDecError
from specdec_tune.runtime.session import parse_draft
from specdec_tune.search.costmodel import CostModel
from specdec_tune.store.yamlio import costs_to_yaml, load_costs, load_profile, save_profile

QUICK = ["--max-gamma", "2", "--repeats", "1", "--context-len", "32", "--device", "cpu"]


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes")
    return str(write_shape(root, "tiny", layers=2)), str(write_shape(root, "tiny-draft", layers=1))


@pytest.mark.slow
def test_profile_shape_with_a_shape_draft_writes_random_weights(shapes, tmp_path):
    target, draft = shapes
    out = tmp_path / "x.yaml"
    r = invoke(
        "profile", "--shape", target, "--draft", f"shape:{draft}", "--draft", "prompt-lookup",
        "--acceptance-vector", f"shape:{draft}=0.8,0.7", "--out", out, "--json", *QUICK,
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["target"] == {
        "name": "shape:tiny", "dtype": "float32", "num_params": res["target"]["num_params"],
        "weights": "random", "shape": "tiny",
    }  # fmt: skip
    assert len(res["costs"]["verify_ms"]) == 2 and res["costs"]["context_len"] == 32
    assert set(res["best_gamma"]) == {"shape:tiny-draft"}  # prompt lookup: acceptance unknown
    assert {p["draft"] for p in res["predicted"]} == {"shape:tiny-draft"}
    text = out.read_text()
    assert "RANDOM weights" in text.splitlines()[0]
    doc = yaml.safe_load(text)
    assert doc["costs"]["weights"] == "random" and doc["costs"]["shape"] == "tiny"
    assert doc["target"]["weights"] == "random"
    costs, hw = load_costs(out)
    assert hw["slug"] and costs.weights == "random" and costs.t_target_ms > 0
    d, lookup = costs.drafts
    assert (d.name, d.weights, d.acceptance_source, d.acceptance_vector) == (
        "shape:tiny-draft", "random", "given", [0.8, 0.7],
    )  # fmt: skip
    assert d.acceptance_rate == pytest.approx((0.8 + 0.8 * 0.7) / 2) and d.t_draft_ms > 0
    assert (lookup.acceptance_source, lookup.acceptance_vector) == ("unknown", [])
    # A later shape profile takes the acceptance measured (here: given) in this one.
    again = tmp_path / "again.yaml"
    r = invoke(
        "profile", "--target", f"shape:{target}", "--draft", f"shape:{draft}", "--acceptance-from", out,
        "--out", again, "--json", *QUICK,
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    (d,) = load_costs(again)[0].drafts
    assert d.acceptance_source == "from:x.yaml" and d.acceptance_vector == [0.8, 0.7]


@pytest.mark.slow
def test_without_acceptance_costs_are_measured_and_nothing_predicted(shapes):
    target, draft = shapes
    r = invoke("profile", "--shape", target, "--draft", f"shape:{draft}", *QUICK)
    assert r.exit_code == 0, r.output
    assert "acceptance unknown" in r.stdout and "random" in r.stdout
    assert "predicted best configs" not in r.stdout


@pytest.mark.slow
def test_trained_target_with_a_shape_draft(tiny_dirs, shapes, tmp_path):
    # Prompt lookup's acceptance is measured on the workload; the shape draft's is given.
    _, draft = shapes
    args = ["profile", "--target", tiny_dirs["target"], "--workload", tiny_dirs["workload"], "-n", "8"]
    args += ["--draft", f"shape:{draft}", "--draft", "prompt-lookup", "--max-gamma", "2", "--repeats", "1"]
    out = tmp_path / "mixed.yaml"
    r = invoke(*args, "--acceptance-vector", "0.6", "--device", "cpu", "--out", out)
    assert r.exit_code == 0, r.output
    costs, _ = load_costs(out)
    assert costs.weights == "trained" and costs.shape is None and costs.context_len >= 16
    shape, lookup = costs.drafts
    assert (shape.weights, shape.acceptance_source, shape.acceptance_vector) == (
        "random",
        "given",
        [0.6, 0.6],
    )
    assert (lookup.weights, lookup.acceptance_source) == (None, "measured")
    r = invoke(*args, "--acceptance-vector", "prompt-lookup=0.5", "--device", "cpu")
    one_red_line(r)
    assert "measured here" in r.stderr


@pytest.mark.parametrize(
    "vector", ["1.5", "abc", "0.5,,0.2", "=0.5", "nan", "-0.1", "x=", ",".join(["0.5"] * 65)]
)
def test_malformed_acceptance_vector_is_one_red_line(shapes, vector):
    target, _ = shapes
    r = invoke("profile", "--shape", target, "--acceptance-vector", vector, *QUICK)
    one_red_line(r)
    assert "--acceptance-vector" in r.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--shape", "nope"], "unknown shape 'nope': bundled shapes are llama-3.1-8b"),
        (["--shape", "llama-3.1-8b", "--target", "demo"], "not both"),
        (["--target", "shape:nope"], "unknown shape"),
        (["--target", "demo", "--draft", "shape:nope"], "unknown shape"),
        (["--shape", "llama-3.1-8b", "--context-len", "0"], "--context-len"),
        (["--shape", "llama-3.1-8b", "--acceptance-from", "/nonexistent.yaml"], "no such file"),
        (["--shape", "llama-3.1-8b", "--acceptance-vector", "0.5", "--acceptance-vector", "0.6"], "twice"),
    ],
)
def test_bad_shape_input_is_one_red_line(args, needle):
    # All of these fail before a model is built (the 8B is never instantiated).
    r = invoke("profile", *args, "--device", "cpu")
    one_red_line(r)
    assert needle in r.stderr


def test_acceptance_vector_for_no_such_draft(shapes):
    target, _ = shapes
    r = invoke("profile", "--shape", target, "--acceptance-vector", "other=0.5", *QUICK)
    one_red_line(r)
    assert "no --draft here" in r.stderr


@pytest.mark.parametrize("command", ["bench", "run"])
def test_other_commands_refuse_shapes(shapes, command):
    target, _ = shapes
    one_red_line(invoke(command, "--target", f"shape:{target}", "--device", "cpu"))


# --------------------------------------------------------------- the acceptance plan, unit level


def _stored(tmp_path: Path, *names: str) -> Path:
    costs = make_costs()
    costs.drafts = [DraftCosts(n, 1.0, 0.1, 0.7, [0.9, 0.8]) for n in names]
    path = tmp_path / "cpu.yaml"
    path.write_text(costs_to_yaml(costs, {"slug": "cpu-x-2t", "kind": "cpu"}))
    return path


def test_plan_matches_file_drafts_by_name_without_shape(tmp_path):
    specs = [parse_draft("shape:llama-3.2-1b"), parse_draft("prompt-lookup"), parse_draft("layer-skip:2")]
    given = parse_given([], _stored(tmp_path, "llama-3.2-1b-instruct", "prompt-lookup", "other"))
    plan, notes = acceptance_plan(given, specs, measured=set())
    assert plan["shape:llama-3.2-1b"] == ([0.9, 0.8], "from:cpu.yaml")
    assert plan["prompt-lookup"][0] == [0.9, 0.8]
    assert "layer-skip-2" not in plan and "layer-skip-2" in notes[0]
    # Named vectors first, then the unnamed one, then the file.
    given = parse_given(["shape:llama-3.2-1b=0.5", "0.25"], given.from_file)
    plan, _ = acceptance_plan(given, specs, measured=set())
    assert plan["shape:llama-3.2-1b"] == ([0.5], "given") and plan["layer-skip-2"] == ([0.25], "given")


def test_plan_refuses_ambiguity_and_measured_drafts(tmp_path):
    specs = [parse_draft("shape:llama-3.2-1b"), parse_draft("prompt-lookup")]
    given = parse_given([], _stored(tmp_path, "llama-3.2-1b-instruct", "llama-3.2-1b-base"))
    with pytest.raises(SpecDecError, match="matches several"):
        acceptance_plan(given, specs, measured=set())
    with pytest.raises(SpecDecError, match="measured here"):
        acceptance_plan(parse_given(["prompt-lookup=0.5"]), specs, measured={"prompt-lookup"})
    _, notes = acceptance_plan(parse_given(["0.5"]), specs[1:], measured={"prompt-lookup"})
    assert "not used" in notes[0]


def test_plan_reads_a_run_profile_and_refuses_one_without_costs(tmp_path):
    specs = [parse_draft("shape:llama-3.2-1b")]
    path = save_profile(make_sample_profile(), tmp_path / "p.yaml")  # its drafts: llama-3.2-1b, ...
    plan, _ = acceptance_plan(parse_given([], path), specs, measured=set())
    assert plan["shape:llama-3.2-1b"] == ([0.82, 0.78, 0.75, 0.72, 0.7, 0.68, 0.66, 0.64], "from:p.yaml")
    empty = save_profile(make_sample_profile(costs=None), tmp_path / "none.yaml")
    with pytest.raises(SpecDecError, match="no measured costs"):
        acceptance_plan(parse_given([], empty), specs, measured=set())


def test_apply_pads_to_max_gamma_and_derives_alpha():
    costs = make_costs()
    d = costs.drafts[0]
    d.acceptance_source, d.acceptance_vector = "unknown", []
    apply_acceptance(costs, {d.name: ([0.5], "given")}, 3)
    assert d.acceptance_vector == [0.5, 0.5, 0.5] and d.acceptance_source == "given"
    assert d.acceptance_rate == pytest.approx((0.5 + 0.25 + 0.125) / 3)


# ------------------------------------------------------------------ schema: random weights


def test_random_costs_round_trip_and_predict_only_known_acceptance(tmp_path):
    costs = make_costs()
    costs.weights, costs.shape = "random", "llama-3.1-8b"
    costs.drafts[0].weights = "random"
    costs.drafts[1].acceptance_source, costs.drafts[1].acceptance_vector = "unknown", []
    costs.drafts[2].acceptance_source = "from:cpu.yaml"
    path = tmp_path / "c.yaml"
    path.write_text(costs_to_yaml(costs, {"slug": "nvidia-h200", "kind": "cuda"}))
    loaded, _ = load_costs(path)
    assert loaded == costs
    model = CostModel(loaded)
    assert model.predict("lookup", 2) is None and model.predict(costs.drafts[0].name, 2) > 0
    assert {name for name, _, _ in model.rank(4)} == {costs.drafts[0].name, costs.drafts[2].name}
    p = make_sample_profile(costs=costs)  # `run --costs-file` on such a file keeps it as it was
    assert load_profile(save_profile(p, tmp_path / "p.yaml")).costs == costs


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("weights", "fake", "costs.weights"),
        ("shape", None, "costs.shape"),
        ("drafts.0.acceptance_source", "guessed", "acceptance_source"),
        ("drafts.0.acceptance_source", "from:", "acceptance_source"),
        ("drafts.0.weights", "fake", "drafts[0].weights"),
        ("engine_mode", "warp", "costs.engine_mode"),
    ],
)
def test_bad_weights_fields_are_named(tmp_path, field, value, needle):
    costs = make_costs()
    costs.weights, costs.shape = "random", "llama-3.1-8b"
    doc = yaml.safe_load(costs_to_yaml(costs, {"slug": "x", "kind": "cpu"}))
    where = doc["costs"]
    *parents, last = field.split(".")
    for key in parents:
        where = where[int(key)] if key.isdigit() else where[key]
    where[last] = value
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(SpecDecError, match=needle.replace("[", r"\[")):
        load_costs(path)
