"""The command line end to end on tiny models saved to disk: results, files, and exit codes."""

from __future__ import annotations

import json

import pytest
from helpers import invoke, one_red_line, tiny_args


def test_help_and_version():
    r = invoke("--help")
    assert r.exit_code == 0 and "bench" in r.output and "run" in r.output
    r = invoke("--version")
    assert r.exit_code == 0 and r.output.startswith("specdec-tune ")


def test_help_imports_no_torch():
    import subprocess
    import sys

    code = "import sys; from specdec_tune.cli import app; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


@pytest.mark.slow
def test_bench_json(tiny_dirs, tmp_path):
    out = tmp_path / "outs.jsonl"
    r = invoke(
        "bench",
        *tiny_args(tiny_dirs, "--draft", tiny_dirs["draft"], "-g", "3", "-n", "12", "--repeats", "1"),
        "--save-outputs",
        out,
        "--json",
    )
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    for key in (
        "tokens_per_s",
        "baseline_tokens_per_s",
        "speedup",
        "acceptance_rate",
        "mean_accepted_len",
        "per_position_acceptance",
        "repeats",
        "speedup_spread",
    ):
        assert key in res
    assert res["mismatches"] == 0 and res["speedup"] > 0 and res["acceptance_rate"] > 0.2
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 3 and all(len(x["token_ids"]) == 12 and x["text"] for x in lines)


def test_bench_prompt_lookup_and_layer_skip(tiny_dirs):
    for draft in ("prompt-lookup:1-2", "layer-skip:1"):
        r = invoke("bench", *tiny_args(tiny_dirs, "--draft", draft, "-n", "6", "--repeats", "1", "--json"))
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["mismatches"] == 0


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--draft", "/nonexistent/model"], "does not exist"),
        (["--gamma", "0"], "gamma"),
        (["--gamma", "65"], "gamma"),
        (["--threshold", "1.0"], "threshold"),
        (["--temperature", "-1"], "temperature"),
        (["--max-new-tokens", "0"], "max_new_tokens"),
        (["--prompt", "   "], "empty"),
        (["--device", "tpu"], "unknown device"),
        (["--device", "cuda"], "CUDA"),
        (["--draft", "layer-skip:9"], "layer"),
    ],
)
def test_bench_bad_input_is_one_red_line(tiny_dirs, extra, needle):
    args = [
        "bench",
        "--target",
        tiny_dirs["target"],
        "--draft",
        tiny_dirs["draft"],
        "--workload",
        tiny_dirs["workload"],
    ]
    r = invoke(*args, "-n", "4", "--repeats", "1", *extra)
    one_red_line(r)
    assert needle.lower() in r.stderr.lower()


def test_tokenizer_mismatch_is_named(tiny_dirs):
    r = invoke("bench", *tiny_args(tiny_dirs, "--draft", tiny_dirs["other"], "-n", "4"))
    one_red_line(r)
    assert "tokenizer" in r.stderr and "80" in r.stderr


def test_missing_target_says_it_never_downloads(tiny_dirs):
    r = invoke("bench", "--target", "some-org/not-cached-model", "--device", "cpu")
    one_red_line(r)
    assert "never downloads" in r.stderr


def test_bad_workload_names_the_line(tiny_dirs, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "w2 w3"}\nnot json\n')
    r = invoke(
        "bench",
        "--target",
        tiny_dirs["target"],
        "--draft",
        "prompt-lookup",
        "--workload",
        bad,
        "--device",
        "cpu",
    )
    one_red_line(r)
    assert "line 2" in r.stderr


@pytest.mark.slow
def test_profile_json_and_out(tiny_dirs, tmp_path):
    out = tmp_path / "costs.yaml"
    r = invoke(
        "profile",
        *tiny_args(
            tiny_dirs,
            "--draft",
            tiny_dirs["draft"],
            "--draft",
            "prompt-lookup",
            "--max-gamma",
            "4",
            "--repeats",
            "3",
            "-n",
            "8",
            "--out",
            out,
            "--json",
        ),
    )
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert len(res["costs"]["verify_ms"]) == 4
    assert {d["name"] for d in res["costs"]["drafts"]} == {"draft", "prompt-lookup"}
    assert out.is_file()
    from specdec_tune.store.yamlio import load_costs

    costs, hw = load_costs(out)
    assert costs.t_target_ms > 0 and hw["slug"]


@pytest.mark.parametrize(
    "extra", [["--max-gamma", "0"], ["--max-gamma", "65"], ["--out", "/proc/nope/costs.yaml"]]
)
def test_profile_bad_input(tiny_dirs, extra):
    one_red_line(invoke("profile", *tiny_args(tiny_dirs, *extra)))


def test_an_unwritable_output_is_refused_before_anything_is_measured(tmp_path):
    from pathlib import Path

    from specdec_tune.app.common import check_writable
    from specdec_tune.errors import SpecDecError

    # as root os.access says /proc is writable: only a file made there says it is not (the
    # profile above used to measure everything first, then fail to write)
    with pytest.raises(SpecDecError, match=r"cannot write /proc/nope/costs\.yaml"):
        check_writable(Path("/proc/nope/costs.yaml"))
    check_writable(tmp_path / "new" / "deeper" / "p.yaml")  # folders that do not exist yet are made later
    assert list(tmp_path.iterdir()) == []  # the probe leaves nothing behind


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--trials", "0"], "--trials"),
        (["--max-gamma", "65"], "--max-gamma"),
        (["--sampler", "random"], "sampler"),
        (["--repeats", "0"], "--repeats"),
        (["--finalists", "-1"], "--finalists"),
        (["--final-repeats", "0"], "--final-repeats"),
        (["--timeout", "0"], "--timeout"),
        (["--prompts", "0"], "--prompts"),
        (["--temperature", "-1"], "temperature"),
        (["--batch-sizes", "1,x"], "--batch-sizes"),
        (["--batch-sizes", "0"], "--batch-sizes"),
        (["--batch-sizes", ""], "--batch-sizes"),
        (["--budget", "-5"], "--budget"),
    ],
)
def test_run_bad_input_is_one_red_line(tiny_dirs, tmp_path, extra, needle):
    storage = f"sqlite:///{tmp_path / 's.db'}"
    r = invoke("run", *tiny_args(tiny_dirs, "--no-profile", "--storage", storage, *extra))
    one_red_line(r)
    assert needle in r.stderr
    assert not (tmp_path / "s.db").exists()  # refused before anything was measured or stored


@pytest.mark.parametrize(
    ("extra", "needle"), [(["-b", "0"], "--batch-size"), (["-b", "2", "--compare-hf"], "batch size 1")]
)
def test_bench_bad_batch_input_is_one_red_line(tiny_dirs, extra, needle):
    r = invoke("bench", *tiny_args(tiny_dirs, "--draft", "prompt-lookup", *extra))
    one_red_line(r)
    assert needle in r.stderr


@pytest.mark.slow
def test_bench_at_a_batch_size_reports_both_sides(tiny_dirs):
    r = invoke(
        "bench",
        *tiny_args(
            tiny_dirs,
            "--draft",
            tiny_dirs["draft"],
            "-g",
            "3",
            "-n",
            "8",
            "-b",
            "2",
            "--repeats",
            "1",
            "--json",
        ),
    )
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert (
        res["batch_size"] == 2 and res["mismatches"] == 0 and res["proposed"] if "proposed" in res else True
    )
    for side in ("speculative", "plain"):
        s = res[side]
        assert s["tokens_per_s"] > 0 and 0 < s["latency_ms_p50"] <= s["latency_ms_p90"]
        assert s["peak_memory_mb"] is None or s["peak_memory_mb"] > 0
    assert res["speedup"] == pytest.approx(res["tokens_per_s"] / res["baseline_tokens_per_s"], rel=0.5)
