"""`check --format benchmark-action`: github-action-benchmark's customBiggerIsBetter entries."""

from __future__ import annotations

from specdec_tune.output.benchmark_action import benchmark_action_entries
from specdec_tune.output.check import CheckItem, CheckReport


def test_entries_are_custom_bigger_is_better_records_with_stable_names():
    report = CheckReport(
        profile="profiles/cpu-intel-xeon-2t/demo.yaml",
        config="draft-1l γ=4 t=0.25",
        items=[
            CheckItem("target weights", "sha256:ab", "sha256:ab", True),
            CheckItem("speedup", 1.6442, 1.5, True, "must be >= 1.480"),
            CheckItem("acceptance_rate", 0.68944, 0.69, True),
            CheckItem("greedy exactness", 0, 0, True),
            CheckItem("tokens_per_s", 266.73, 250.1, True, "information only"),
            CheckItem("baseline_tokens_per_s", 162.22, 166.0, True, "information only"),
        ],
    )
    entries = benchmark_action_entries(report)
    assert [e["name"] for e in entries] == [
        "cpu-intel-xeon-2t/demo draft-1l γ=4 t=0.25: speedup",
        "cpu-intel-xeon-2t/demo draft-1l γ=4 t=0.25: acceptance_rate",
        "cpu-intel-xeon-2t/demo draft-1l γ=4 t=0.25: tokens_per_s",
        "cpu-intel-xeon-2t/demo draft-1l γ=4 t=0.25: baseline_tokens_per_s",
    ]
    assert all(set(e) == {"name", "unit", "value", "extra"} for e in entries)
    assert entries[0]["value"] == 1.5 and entries[0]["unit"] == "x"
    assert "stored 1.6442" in entries[0]["extra"]
