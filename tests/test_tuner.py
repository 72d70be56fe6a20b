"""The search: end to end, resume, failing trials, shared storage between processes."""

from __future__ import annotations

import json
import subprocess
import sys

import optuna
import pytest
from test_cli import invoke, tiny_args

from specdec_tune.measure import Case
from specdec_tune.profile import DraftSpec, load_profile, profile_to_dict
from specdec_tune.tuner import DrafterPool, TuneSettings, _counted, tune


def small_case(prompts):
    return Case([p for p in prompts[1:4]], [8, 8, 8], [], 0.0)


def specs():
    return [
        DraftSpec("draft", "model", path="x"),
        DraftSpec("prompt-lookup", "prompt_lookup", ngram_min=1, ngram_max=3),
    ]


def pool(target, draft):
    return DrafterPool(specs(), target, load=lambda spec: draft)


def test_tune_finds_a_config_and_records_everything(tiny_target, tiny_draft, prompts, tmp_path):
    storage = f"sqlite:///{tmp_path / 's.db'}"
    settings = TuneSettings(trials=6, storage=storage, study_name="t", repeats=1, max_gamma=4)
    res = tune(tiny_target, specs(), small_case(prompts), settings, pool=pool(tiny_target, tiny_draft))
    assert res.trials == 6 and len(res.rows) == 6
    assert res.results == sorted(res.results, key=lambda r: -r.metrics.speedup)
    best = res.results[0]
    assert best.metrics.speedup >= max(r.metrics.speedup for r in res.results)
    study = optuna.load_study(study_name="t", storage=storage)
    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert done and all(
        "acceptance_rate" in t.user_attrs and "per_position_acceptance" in t.user_attrs for t in done
    )
    # "none" (gamma 0) is always tried first: the answer may be "don't speculate".
    assert study.trials[0].params == {"draft": "none"}


def test_resume_keeps_finished_trials(tiny_target, tiny_draft, prompts, tmp_path):
    storage = f"sqlite:///{tmp_path / 's.db'}"
    case = small_case(prompts)
    calls = []

    def stop_after_three(done, total, best):
        calls.append(done)
        if done == 3:
            raise KeyboardInterrupt

    settings = TuneSettings(trials=5, storage=storage, study_name="r", repeats=1, max_gamma=4)
    with pytest.raises(KeyboardInterrupt):
        tune(
            tiny_target,
            specs(),
            case,
            settings,
            pool=pool(tiny_target, tiny_draft),
            on_trial=stop_after_three,
        )
    study = optuna.load_study(study_name="r", storage=storage)
    first = {t.number: t.params for t in study.trials if t.state.name == "COMPLETE"}
    assert len(first) == 3
    res = tune(tiny_target, specs(), case, settings, pool=pool(tiny_target, tiny_draft))
    study = optuna.load_study(study_name="r", storage=storage)
    assert _counted(study) == 5 and res.trials == 5
    after = {t.number: t.params for t in study.trials if t.state.name == "COMPLETE"}
    assert all(after[n] == p for n, p in first.items())  # nothing lost, nothing re-run


def test_failing_trial_does_not_kill_the_study(tiny_target, tiny_draft, prompts, tmp_path):
    def load(spec):
        raise RuntimeError("CUDA out of memory (simulated)")

    broken = DrafterPool(specs(), tiny_target, load=load)
    settings = TuneSettings(
        trials=8, storage=f"sqlite:///{tmp_path / 's.db'}", study_name="f", repeats=1, max_gamma=3
    )
    res = tune(tiny_target, specs(), small_case(prompts), settings, pool=broken)
    assert res.failed >= 1 and res.trials == 8
    errors = [r["error"] for r in res.rows if r["error"]]
    assert errors and all("out of memory" in e for e in errors)
    assert all(r.config.draft.name != "draft" for r in res.results)


def test_run_end_to_end_writes_profile_and_csv(tiny_dirs, tmp_path):
    out = tmp_path / "profiles" / "tiny.yaml"
    r = invoke(
        "run",
        *tiny_args(
            tiny_dirs,
            "--draft",
            tiny_dirs["draft"],
            "--draft",
            "prompt-lookup",
            "--layer-skip",
            "1",
            "--trials",
            "6",
            "--max-gamma",
            "3",
            "-n",
            "8",
            "--repeats",
            "1",
            "--storage",
            f"sqlite:///{tmp_path / 'db.sqlite'}",
            "--out",
            out,
            "--json",
        ),
    )
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    p = load_profile(out)
    assert profile_to_dict(p) == {k: v for k, v in res.items() if k not in ("profile", "trials_csv")}
    assert p.costs is not None and len(p.costs.verify_ms) == 3
    assert p.search.trials == 6 and len(p.alternatives) <= 4
    assert p.best.metrics.speedup >= max([a.metrics.speedup for a in p.alternatives], default=0)
    csv = out.with_suffix(".trials.csv").read_text().splitlines()
    assert csv[0].startswith("number,state,draft,gamma,threshold,speedup") and len(csv) == 7
    # The stored profile is usable by the other commands.
    assert invoke("show", out).exit_code == 0
    plots = invoke("show", out, "--plot", tmp_path / "plots")
    assert plots.exit_code == 0, plots.output
    pngs = sorted((tmp_path / "plots").glob("*.png"))
    assert pngs and all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 1000 for p in pngs)
    e = invoke("export", out, "--to", "vllm")
    assert e.exit_code == 0


def test_corrupted_profile_is_exit_2(tiny_dirs, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema_version: 1\nhardware: {slug: x}\nbest: [")
    for cmd in (["show", bad], ["export", bad], ["check", bad]):
        r = invoke(*cmd)
        assert r.exit_code == 2 and "Traceback" not in r.output


WORKER = """
import sys
from specdec_tune.cli import app
sys.argv = ["specdec-tune", *sys.argv[1:]]
app()
"""


def test_two_processes_share_one_study(tiny_dirs, tmp_path):
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    args = [
        *tiny_args(
            tiny_dirs,
            "--draft",
            "prompt-lookup",
            "--trials",
            "6",
            "--max-gamma",
            "3",
            "-n",
            "6",
            "--repeats",
            "1",
            "--no-profile",
            "--storage",
            storage,
            "--study-name",
            "shared",
        )
    ]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, "run", *args, "--out", str(tmp_path / f"p{i}.yaml"), "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    for p in procs:
        _out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    study = optuna.load_study(study_name="shared", storage=storage)
    counted = [t for t in study.trials if not t.user_attrs.get("surplus") and t.state.name != "RUNNING"]
    assert _counted(study) == 6 and len(counted) == 6
    assert len({t.number for t in counted}) == 6


def test_grid_run_with_sampling_covers_the_whole_grid(tiny_dirs, tmp_path):
    out = tmp_path / "grid.yaml"
    r = invoke(
        "run",
        *tiny_args(
            tiny_dirs,
            "--draft",
            "prompt-lookup",
            "--layer-skip",
            "1",
            "--sampler",
            "grid",
            "--max-gamma",
            "2",
            "--temperature",
            "0.7",
            "-n",
            "6",
            "--repeats",
            "1",
            "--no-profile",
            "--storage",
            f"sqlite:///{tmp_path / 'g.db'}",
            "--out",
            out,
            "--json",
        ),
    )
    assert r.exit_code == 0, r.output
    p = load_profile(out)
    # baseline + lookup γ1..2 + layer-skip γ1..2 × 4 thresholds = 11 configs, each tried once.
    assert p.search.trials == 11 and p.search.sampler == "grid"
    assert p.workload.temperature == 0.7
    rows = out.with_suffix(".trials.csv").read_text().splitlines()[1:]
    configs = {tuple(row.split(",")[2:5]) for row in rows}
    assert len(rows) == len(configs) == 11
