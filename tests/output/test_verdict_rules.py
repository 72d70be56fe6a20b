"""`check`'s rules, one test each, on fabricated evidence: what the OS said, what the anchors and the
re-measurement read, in; the environment, the items and the verdict, out. No model, no CLI, no
timing: the numbers are the examples of output.check's, output.environment's and
checkpolicy's docstrings."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
from helpers import documented_fields

from specdec_tune.checkpolicy import CHECK_POLICY, LLAMACPP_CHECK_POLICY, CheckPolicy
from specdec_tune.domain import Anchors, Metrics
from specdec_tune.measure.anchors import MachineSpeed
from specdec_tune.measurement import Measurement
from specdec_tune.output.anchors import anchor_verdict
from specdec_tune.output.check import (
    SHARED,
    Evidence,
    another_look,
    confirm_repeats,
    judge_config,
    judge_measured,
    needs_confirmation,
    speedup_item,
    weights_item,
)
from specdec_tune.output.environment import BUSY, QUIET, Environment, classify, load_of, other_software
from specdec_tune.output.environment import SHARED as SHARED_LOAD
from specdec_tune.output.rates import OTHER_MACHINE, SHARED_RATE
from specdec_tune.output.verdicts import CheckReport

QUIET_OS = {"others_cpu_share": 0.02, "steal_share": 0.0}


def _stored(
    speedup=1.0, samples=(0.99, 1.0, 1.01), acceptance=0.7, kind="model", tokens=100.0, baseline=80.0
):
    metrics = Metrics(tokens, baseline, speedup, 0.02, acceptance, 2.0, speedup_samples=list(samples))
    return SimpleNamespace(config=SimpleNamespace(draft=SimpleNamespace(kind=kind)), metrics=metrics)


def _measured(
    speedups,
    acceptance=0.7,
    mismatches=0,
    rates=(100.0, 100.5, 99.5),
    baseline=(80.0, 80.5, 79.5),
    clean=(),
    clean_share=None,
    waited=0.0,
):
    med = sorted(speedups)[len(speedups) // 2]
    metrics = Metrics(sorted(rates)[1], sorted(baseline)[1], med, 0.02, acceptance, 2.0)
    return Measurement(
        metrics, 10, mismatches, list(speedups), rates=list(rates), baseline_rates=list(baseline),
        clean_speedups=list(clean), clean_share=clean_share, waited_share=waited,
    )  # fmt: skip


def _evidence(speedups=(1.0, 1.01, 0.99), load=QUIET, **kw):
    stored = kw.pop("stored", _stored())
    env = kw.pop("environment", Environment(load))
    return Evidence(stored, kw.pop("measured", _measured(list(speedups))), environment=env, **kw)


def _items(e, **kw):
    return {i.metric: i for i in judge_config(e, 0.10, **kw)}


def _verdict(item):
    return "inconclusive" if item.inconclusive else ("pass" if item.ok else "regression")


# ------------------------------------------------------------------ the policy: one place, evidenced


def test_the_policy_is_frozen_and_every_field_has_a_docstring():
    with pytest.raises(dataclasses.FrozenInstanceError):
        CHECK_POLICY.tolerance = 0.2  # type: ignore[misc]
    assert documented_fields(CheckPolicy) == {f.name for f in dataclasses.fields(CheckPolicy)}


def test_a_backend_difference_is_a_value_of_the_policy():
    """Each session carries the policy it is judged by: no lookup by the backend's name."""
    from specdec_tune.backends.llamacpp import LlamaCppSession
    from specdec_tune.backends.native import NativeSession

    assert NativeSession.policy is CHECK_POLICY
    llama = LlamaCppSession.policy
    assert llama.busy_beyond_free_cores_share == LLAMACPP_CHECK_POLICY.busy_beyond_free_cores_share == 0.10
    assert CHECK_POLICY.busy_beyond_free_cores_share is None
    # llama-server's absolute tokens/s are reported, not judged (no fresh-process reference)
    assert llama.judged_rates == () and CHECK_POLICY.judged_rates == ("baseline_tokens_per_s",)
    assert llama.tolerance == CHECK_POLICY.tolerance
    from specdec_tune.backends.vllm.session import VllmSession

    # vLLM: llama.cpp's busy rule, and a first server pair's reading confirmed unless clear
    assert VllmSession.policy.busy_beyond_free_cores_share == 0.10
    assert VllmSession.policy.confirm_pair_spread and not llama.confirm_pair_spread


# --------------------------------------------------------------------------- the environment


def test_little_other_work_is_a_quiet_machine():
    assert load_of({"others_cpu_share": 0.02, "steal_share": 0.0}) == QUIET
    assert load_of({"others_cpu_share": None, "steal_share": None}) == QUIET  # /proc could not tell


def test_other_work_past_a_tenth_of_the_cpus_is_a_shared_machine():
    # 2 s bursts on one of two cores read 18 % of all CPUs: short of busy
    assert load_of({"others_cpu_share": 0.18, "steal_share": 0.0}) == SHARED_LOAD
    assert load_of({"others_cpu_share": 0.0, "steal_share": 0.06}) == SHARED_LOAD


def test_other_work_past_a_quarter_of_the_cpus_or_steal_past_a_tenth_is_a_busy_machine():
    assert load_of({"others_cpu_share": 0.40, "steal_share": 0.0}) == BUSY
    assert load_of({"others_cpu_share": 0.0, "steal_share": 0.2}) == BUSY
    assert load_of({"others_cpu_share": 0.25, "steal_share": 0.10}) == SHARED_LOAD  # the lines themselves


def test_a_later_window_only_adds_load_to_what_the_check_saw():
    # a further look at a shared machine that found it quiet leaves it shared; one found busy makes it busy
    shared = Environment(load=SHARED_LOAD, drifting=True)
    assert shared.at_worst(QUIET) == shared
    assert shared.at_worst(BUSY) == Environment(load=BUSY, drifting=True)
    assert Environment().at_worst(SHARED_LOAD).load == SHARED_LOAD


def test_a_window_found_busy_makes_the_check_busy():
    # the anchors measured again, or a confirming process, saw other work
    assert load_of(QUIET_OS, busy_seen=True) == BUSY


def test_llamacpp_is_busy_by_the_cores_its_threads_leave_free():
    info = {"others_cpu_share": 0.12, "steal_share": 0.0}
    assert load_of(info, LLAMACPP_CHECK_POLICY, threads=2, cpus=2) == BUSY  # 0.24 CPUs > 0 free + 0.2
    assert load_of(info, threads=2, cpus=2) == SHARED_LOAD  # the native rule
    info = {"others_cpu_share": 0.20, "steal_share": 0.0}
    assert load_of(info, LLAMACPP_CHECK_POLICY, threads=1, cpus=2) == QUIET  # one core free
    assert load_of(info, threads=1, cpus=2) == SHARED_LOAD


def test_the_matmul_anchor_moving_over_5_percent_is_a_drifting_machine():
    assert classify(QUIET_OS, drift=0.10).drifting
    assert not classify(QUIET_OS, drift=0.04).drifting
    # the plain rate timed per decode-anchor step: the host's speed cancels
    assert not classify(QUIET_OS, drift=0.10, drift_cancels=True).drifting
    assert classify(QUIET_OS, drift=0.10).quiet and classify(QUIET_OS, drift=0.10).rates_doubtful


def test_another_engine_build_is_other_software():
    assert other_software({"binary_sha256": "aa"}, {"binary_sha256": "bb"})
    assert not other_software({"binary_sha256": "aa"}, {"binary_sha256": "aa"})


# ------------------------------------------------------------------- other hardware (anchors)

MACHINE = {"plain_tokens_per_s": 80.0, "copy_bandwidth_gbps": 20.0, "matmul_gflops": 100.0}


def _profile(cv=None, **anchors):
    noise = SimpleNamespace(plain_pass_cv=cv) if cv is not None else None
    return SimpleNamespace(anchors=Anchors(**anchors), noise=noise)


def test_machine_anchors_beyond_1_3x_on_a_quiet_machine_are_other_hardware():
    v = anchor_verdict(_profile(**MACHINE), 80.0, MachineSpeed(20 / 1.8, 100 / 1.8, 0.02), False)
    assert v.other_hardware and not v.judge_rates and v.slowdown == pytest.approx(1.8)
    v = anchor_verdict(_profile(**MACHINE), 80.0, MachineSpeed(20.0, 100 / 1.25, 0.02), False)
    assert not v.other_hardware and v.judge_rates  # 1.25x: within the tolerance


def test_slow_anchors_on_a_busy_machine_are_the_loads():
    v = anchor_verdict(_profile(**MACHINE), 80.0, MachineSpeed(20 / 1.8, 100 / 1.8, 0.02), True)
    assert not v.other_hardware and v.judge_rates  # judged, and a drop there is inconclusive


def test_agreeing_anchors_put_the_rates_at_the_profiles_machine_speed():
    v = anchor_verdict(_profile(**MACHINE), 80.0, MachineSpeed(20.0, 95.0, 0.02), False)
    assert v.rate_scale == pytest.approx(100 / 95)


def test_the_anchors_own_spread_widens_their_tolerance():
    v = anchor_verdict(_profile(**MACHINE), 80.0, MachineSpeed(20 / 1.5, 100 / 1.5, 0.6, 0.6), False)
    assert v.tolerance == pytest.approx(0.6) and not v.other_hardware


def test_without_machine_anchors_plain_decoding_decides_within_4_times_its_variation():
    p = _profile(plain_tokens_per_s=80.0)
    assert anchor_verdict(p, 80 / 1.8, None, False).other_hardware
    # plain passes that varied 20 % widen the tolerance to 0.8: 1.7x slower is not other hardware
    wide = _profile(cv=0.2, plain_tokens_per_s=80.0)
    v = anchor_verdict(wide, 80 / 1.7, None, False)
    assert v.tolerance == pytest.approx(0.8) and not v.other_hardware and not v.judge_rates


# ------------------------------------------------------------------------------ the speedup


def test_a_speedup_at_the_stored_one_passes():
    item = speedup_item(_evidence([1.0, 1.01, 0.99]), 0.10)
    assert _verdict(item) == "pass" and item.stored == 1.0 and "vs stored repeats" in item.note


def test_a_speedup_clearly_below_the_floor_on_a_quiet_machine_is_a_regression():
    item = speedup_item(_evidence([0.5, 0.6, 0.55]), 0.10)
    assert _verdict(item) == "regression" and item.measured == pytest.approx(0.55, abs=1e-3)


def test_a_speedup_drop_on_a_shared_machine_is_inconclusive():
    item = speedup_item(_evidence([0.84, 0.85, 0.86], SHARED_LOAD), 0.10)
    assert _verdict(item) == "inconclusive" and f"inconclusive: {SHARED}" in item.note
    assert "busy" not in item.note  # short of the OS rule's busy: not called busy


def test_a_speedup_drop_on_a_busy_machine_is_inconclusive():
    assert _verdict(speedup_item(_evidence([0.74, 0.75, 0.76], BUSY), 0.10)) == "inconclusive"


@pytest.mark.parametrize("load", [SHARED_LOAD, BUSY])
def test_a_drop_no_load_explains_is_a_regression_on_any_machine(load):
    # the planted 100 ms per drafting step of test_check.py read 0.11x on a shared CI runner
    item = speedup_item(_evidence([0.10, 0.11, 0.12], load), 0.10)
    assert _verdict(item) == "regression" and "no load measured" in item.note
    # just above the policy's line a load could still explain it: inconclusive
    line = CHECK_POLICY.load_explains_down_to
    assert _verdict(speedup_item(_evidence([line + 0.01, line + 0.02, line + 0.03], load), 0.10)) == (
        "inconclusive"
    )


def test_a_passing_speedup_on_a_shared_machine_says_so():
    item = speedup_item(_evidence([1.0, 1.01, 0.99], SHARED_LOAD), 0.10)
    assert _verdict(item) == "pass" and item.note.endswith(f"; {SHARED}")


def test_a_speedup_too_noisy_to_tell_is_inconclusive():
    item = speedup_item(
        _evidence([0.6, 1.3, 0.85, 1.2, 0.7], stored=_stored(samples=[0.98, 1.0, 1.02])), 0.10
    )
    assert _verdict(item) == "inconclusive" and "too noisy to tell" in item.note


def test_the_speedup_is_judged_against_two_or_more_reference_processes():
    # the reference processes measured 1.2x; the final round's 1.0x: 1.0 now is 17 % below
    e = _evidence([1.0, 1.01, 0.99], reference={"speedup": [1.2, 1.21, 1.19]})
    item = speedup_item(e, 0.10)
    assert _verdict(item) == "regression" and item.stored == 1.2 and "the reference (3 fresh" in item.note
    one = _evidence([1.0, 1.01, 0.99], reference={"speedup": [1.2]})  # one process: no spread, not used
    assert _verdict(speedup_item(one, 0.10)) == "pass"


def test_on_the_check_slice_the_reference_processes_every_repeat_is_the_stored_side():
    """Three process medians [2.0, 2.0, 2.0] say nothing of their spread; their nine repeats do. A
    speedup 0.87 of theirs is judged against the repeats: with those 40 % apart it cannot be told
    from an unchanged one (inconclusive), where the medians alone made it a regression."""
    now = [1.74, 1.75, 1.73, 1.74]
    medians = {"speedup": [2.0, 2.0, 2.0]}
    assert _verdict(speedup_item(_evidence(now, reference=medians), 0.10)) == "regression"
    wide = {**medians, "speedup_repeats": [1.6, 2.0, 2.4, 1.7, 2.0, 2.3, 1.8, 2.0, 2.2]}
    item = speedup_item(_evidence(now, reference=wide), 0.10)
    assert _verdict(item) == "inconclusive" and "the reference (3 fresh processes, 9 repeats)" in item.note
    # repeats alone, without enough processes beside them, are not a reference
    lone = _evidence(now, reference={"speedup": [2.0], "speedup_repeats": [2.0, 2.0, 2.0]})
    assert "the reference" not in speedup_item(lone, 0.10).note


def test_a_confirmed_speedup_is_judged_on_all_repeats_and_says_so():
    again = _measured([1.0, 1.05, 0.98])
    item = speedup_item(_evidence([0.85, 0.88, 0.80], again=again), 0.10)
    assert _verdict(item) == "pass" and "first 0.850, so re-measured: 6 repeats" in item.note


# --------------------------------------------------------------------------- the acceptance


def test_greedy_acceptance_within_0_02_passes_and_beyond_fails():
    ok = _items(_evidence(measured=_measured([1.0], acceptance=0.69)))["acceptance_rate"]
    assert ok.ok and ok.note == "must be within ±0.020"
    assert not _items(_evidence(measured=_measured([1.0], acceptance=0.67)))["acceptance_rate"].ok


def test_sampled_acceptance_may_move_0_08():
    e = _evidence(measured=_measured([1.0], acceptance=0.65), temperature=0.8)
    assert _items(e)["acceptance_rate"].ok and "±0.080" in _items(e)["acceptance_rate"].note


def test_a_given_acceptance_tolerance_replaces_the_default():
    e = _evidence(measured=_measured([1.0], acceptance=0.5))
    assert _items(e, acceptance_tolerance=0.25)["acceptance_rate"].ok


def test_acceptance_is_judged_on_a_busy_machine_too():
    e = _evidence(measured=_measured([1.0], acceptance=0.5), load=BUSY)
    assert not _items(e)["acceptance_rate"].ok


def test_a_config_without_a_draft_has_no_acceptance_item():
    assert "acceptance_rate" not in _items(_evidence(stored=_stored(kind="none")))


# -------------------------------------------------------------------------------- exactness


def test_a_greedy_output_that_differs_fails_exactness_and_sampling_has_no_such_item():
    item = _items(_evidence(measured=_measured([1.0], mismatches=1), load=BUSY))["greedy exactness"]
    assert not item.ok and item.measured == 1
    assert "greedy exactness" not in _items(_evidence(temperature=0.8))


# -------------------------------------------------------------------------------- the rates

SLOWER_PLAIN = dict(rates=(85.0, 86.0, 84.5), baseline=(68.0, 68.5, 67.6))


def test_rates_are_information_only_where_the_anchors_do_not_agree():
    items = _items(_evidence(measured=_measured([1.0, 1.01, 0.99], **SLOWER_PLAIN)))
    assert items["baseline_tokens_per_s"].ok and items["baseline_tokens_per_s"].note == "information only"


def test_a_clearly_slower_plain_rate_where_the_anchors_agree_is_a_regression():
    e = _evidence(measured=_measured([1.0, 1.01, 0.99], **SLOWER_PLAIN), judge_rates=True)
    items = _items(e)
    assert _verdict(items["baseline_tokens_per_s"]) == "regression" and items["speedup"].ok
    assert items["tokens_per_s"].note.startswith("information only")  # never judged on its own


def test_a_slower_plain_rate_on_a_drifting_machine_is_inconclusive():
    m = _measured([1.0, 1.01, 0.99], **SLOWER_PLAIN)
    env = Environment(QUIET, drifting=True)
    item = _items(_evidence(measured=m, judge_rates=True, environment=env))["baseline_tokens_per_s"]
    assert _verdict(item) == "inconclusive" and "own speed moved" in item.note


def test_an_absolute_rate_beside_other_work_is_information_only_not_inconclusive():
    # A 15 % lower plain rate while other work shared the machine: the host's, not judged; the
    # speedup carries the verdict, so the check answers (pass) instead of exit 6.
    m = _measured([1.0, 1.01, 0.99], **SLOWER_PLAIN)
    for load in (SHARED_LOAD, BUSY):
        e = _evidence(measured=m, judge_rates=True, environment=Environment(load))
        item = _items(e)["baseline_tokens_per_s"]
        assert _verdict(item) == "pass" and item.note == SHARED_RATE


def test_a_speedup_drop_against_another_machines_reference_says_how_to_measure_one_here():
    """A speedup does not carry between VMs of one slug (docs/ci.md): a regression judged against
    another machine's reference stays a regression, and its note names `specdec-tune reference`;
    on the profile's own machine, or where it passes, the note does not."""
    from specdec_tune.output.check import ELSEWHERE

    e = _evidence(speedups=(0.86, 0.87, 0.85), same_machine=False)
    item = _items(e)["speedup"]
    assert _verdict(item) == "regression" and item.note.endswith(ELSEWHERE)
    own = _items(dataclasses.replace(e, same_machine=True))["speedup"]
    assert _verdict(own) == "regression" and ELSEWHERE not in own.note
    passing = _items(_evidence(same_machine=False))["speedup"]
    assert _verdict(passing) == "pass" and ELSEWHERE not in passing.note


def test_a_drop_another_machines_matmul_speed_explains_cannot_be_told_from_the_machine():
    """output.elsewhere: against another machine's reference, a drop down to the floor times the
    two machines' matmul ratio is inconclusive (the unchanged demo profile read 0.843-0.869x its
    stored speedup on a VM whose matmul read 0.846x, docs/ci.md), with `specdec-tune reference` as
    the answer; a drop beyond it (a planted 15 % on top: 0.73) is still a regression, and on the
    reference's own machine nothing changes."""
    from specdec_tune.output.elsewhere import ANSWER, ELSEWHERE, machine_floor

    e = _evidence(speedups=(0.84, 0.85, 0.83), same_machine=False, machine_ratio=0.846)
    assert machine_floor(e, 0.10) == pytest.approx(0.9 * 0.846)
    item = _items(e)["speedup"]
    assert _verdict(item) == "inconclusive" and item.answer == ANSWER
    assert "another machine's, whose matmul anchor this one reads at 0.846x" in item.note
    assert "down to 0.761" in item.note and ELSEWHERE not in item.note
    # a machine faster at matmul moves it as far the other way round
    assert machine_floor(dataclasses.replace(e, machine_ratio=1 / 0.846), 0.10) == pytest.approx(0.9 * 0.846)
    planted = _items(dataclasses.replace(e, measured=_measured([0.73, 0.74, 0.72])))["speedup"]
    assert _verdict(planted) == "regression" and planted.note.endswith(ELSEWHERE)
    for same in (dataclasses.replace(e, same_machine=True), dataclasses.replace(e, machine_ratio=None)):
        assert machine_floor(same, 0.10) is None and _verdict(_items(same)["speedup"]) == "regression"
    assert machine_floor(dataclasses.replace(e, machine_ratio=1.0), 0.10) is None  # anchors agree


def test_the_machine_ratio_is_taken_against_the_anchor_measured_where_the_reference_was():
    """app.checking.machine_ratio: on the check slice against the reference processes' matmul (one
    thread there), off it against theirs or else the run's (the engine's threads, as this check)."""
    from specdec_tune.app.checking import machine_ratio

    both = SimpleNamespace(anchors=SimpleNamespace(reference_matmul_gflops=102.8, matmul_gflops=184.4))
    run_only = SimpleNamespace(anchors=SimpleNamespace(reference_matmul_gflops=None, matmul_gflops=179.6))
    assert machine_ratio(both, SimpleNamespace(matmul_gflops=87.0), True) == pytest.approx(87.0 / 102.8)
    assert machine_ratio(run_only, SimpleNamespace(matmul_gflops=165.9), False) == pytest.approx(
        165.9 / 179.6
    )
    assert machine_ratio(run_only, SimpleNamespace(matmul_gflops=87.0), True) is None  # not like for like
    assert machine_ratio(SimpleNamespace(anchors=None), SimpleNamespace(matmul_gflops=87.0), False) is None


def test_an_absolute_rate_on_another_machine_of_the_slug_is_other_machine_information():
    # The quiet check on another VM: plain 0.76x the stored rate, speedup unchanged.
    m = _measured([1.0, 1.01, 0.99], baseline=(60.8, 61.0, 60.5))
    e = _evidence(measured=m, judge_rates=True, same_machine=False)
    report = CheckReport("p.yaml", "cfg", items=judge_config(e, 0.10))
    item = {i.metric: i for i in report.items}["baseline_tokens_per_s"]
    assert item.note == OTHER_MACHINE and report.passed and not report.inconclusive
    # the same numbers on the profile's own machine: a regression
    assert (
        _verdict(_items(dataclasses.replace(e, same_machine=True))["baseline_tokens_per_s"]) == "regression"
    )


def test_a_batch_rows_rates_on_another_machine_say_so():
    e = _evidence(where=" @ B=16", same_machine=False, measured=_measured([1.0], baseline=(160.0,) * 3))
    item = _items(e)["baseline_tokens_per_s @ B=16"]
    assert item.ok and item.note == OTHER_MACHINE


def test_the_plain_rate_per_decode_anchor_step_is_judged_on_another_machine_too():
    # a ratio measured in this run: the host (another VM) cancels, a slower target does not
    reference = {"baseline_tokens_per_s": [80.0, 80.5, 79.5], "plain_per_anchor": [0.70, 0.705, 0.695]}
    m = _measured([1.0, 1.01, 0.99], baseline=(120.0, 121.0, 119.0))
    m.plain_per_anchor = [0.59, 0.595, 0.592]  # 15 % fewer plain tokens per anchor step
    e = _evidence(measured=m, judge_rates=True, reference=reference, same_machine=False)
    assert _verdict(_items(e)["baseline_tokens_per_s"]) == "regression"


def test_rates_are_scaled_to_the_profiles_machine_speed():
    # 73.9 plain tokens/s is -7.6 % raw, but -12.2 % with the machine measuring 5 % faster
    m = _measured([1.0, 1.01, 0.99], rates=(93.0, 93.5, 92.5), baseline=(73.9, 74.2, 73.6))
    assert _items(_evidence(measured=m, judge_rates=True))["baseline_tokens_per_s"].ok
    item = _items(_evidence(measured=m, judge_rates=True, rate_scale=100 / 105))["baseline_tokens_per_s"]
    assert not item.ok and item.measured == pytest.approx(73.9) and "scaled ×0.952" in item.note


def test_the_plain_rate_per_decode_anchor_step_cancels_the_hosts_speed():
    reference = {"baseline_tokens_per_s": [80.0, 80.5, 79.5], "plain_per_anchor": [0.70, 0.705, 0.695]}
    m = _measured([1.0, 1.01, 0.99], baseline=(64.0, 64.5, 63.8))  # the host 20 % slower
    m.plain_per_anchor = [0.70, 0.702, 0.699]  # ... and the decode anchor with it
    item = _items(_evidence(measured=m, judge_rates=True, reference=reference))["baseline_tokens_per_s"]
    assert _verdict(item) == "pass" and "per decode-anchor step" in item.note


# ------------------------------------------------------------------- the confirming re-measurement


def test_a_speedup_not_clearly_passing_is_measured_again():
    assert needs_confirmation(_evidence([0.85, 0.88, 0.80]), 0.10)
    assert not needs_confirmation(_evidence([1.0, 1.01, 0.99]), 0.10)


def test_one_server_pairs_reading_passes_at_once_only_clear_of_the_floor():
    """CheckPolicy.confirm_pair_spread (vLLM): 0.925 [0.867, 1.011] of stored passes by its estimate,
    but its interval reaches below the floor: measured again in a new pair. Clear of it: not."""
    pair = dataclasses.replace(CHECK_POLICY, confirm_pair_spread=True)
    e = _evidence([0.88, 0.925, 0.97], stored=_stored(samples=[1.0]))
    assert _verdict(speedup_item(e, 0.10)) == "pass" and not needs_confirmation(e, 0.10)
    assert needs_confirmation(e, 0.10, pair)
    assert not needs_confirmation(_evidence([0.99, 1.0, 1.01]), 0.10, pair)


def test_a_judged_plain_rate_not_clearly_passing_is_measured_again():
    e = _evidence(measured=_measured([1.0, 1.01, 0.99], **SLOWER_PLAIN), judge_rates=True)
    assert needs_confirmation(e, 0.10)
    assert not needs_confirmation(dataclasses.replace(e, judge_rates=False), 0.10)


def test_the_confirmation_takes_the_repeats_its_spread_needs_at_most_12():
    assert confirm_repeats(_measured([0.97, 1.0, 1.03]), 3) == 6
    assert confirm_repeats(_measured([0.85, 0.88, 0.80]), 3) == 12
    assert confirm_repeats(_measured([1.0]), 3) == 3
    assert (
        confirm_repeats(
            _measured([0.85, 0.88, 0.80]), 3, dataclasses.replace(CHECK_POLICY, max_confirm_repeats=20)
        )
        == 15
    )


def test_a_speedup_still_too_noisy_after_its_confirmation_gets_one_more_look():
    stored = _stored(samples=[1.0])
    e = _evidence([0.80, 0.95, 0.86], stored=stored, again=_measured([0.92, 0.78, 0.88]))
    assert _verdict(speedup_item(e, 0.10)) == "inconclusive"
    assert another_look(e, 0.10) == 12  # its spread asks for 16 more: at most max_confirm_repeats
    assert another_look(dataclasses.replace(e, looks=2), 0.10) is None  # confirm_looks: 2
    assert another_look(dataclasses.replace(e, environment=Environment(SHARED_LOAD)), 0.10) is None
    assert another_look(dataclasses.replace(e, again=None), 0.10) is None  # not confirmed yet
    fresh = dataclasses.replace(_measured([0.92, 0.78, 0.88]), processes=2)  # fresh processes' medians
    assert another_look(dataclasses.replace(e, again=fresh), 0.10) is None
    answered = _evidence([0.74, 0.75, 0.76], stored=stored, again=_measured([0.75, 0.76, 0.74]))
    assert another_look(answered, 0.10) is None
    looked = dataclasses.replace(e, again=e.again.joined(_measured([0.86, 0.85, 0.86, 0.87])), looks=2)
    item = speedup_item(looked, 0.10)
    assert _verdict(item) == "regression" and "re-measured twice: 10 repeats" in item.note


def test_a_pass_by_its_estimate_alone_gets_another_look_where_a_pair_passes_only_clear_of_the_floor():
    pair = dataclasses.replace(CHECK_POLICY, confirm_pair_spread=True)
    stored = _stored(samples=[1.0])
    # stop 61's planted check: an estimate above the floor, the interval reaching below it
    e = _evidence([0.95, 0.86, 0.93], stored=stored, again=_measured([0.96, 0.85, 0.92]))
    judged = judge_measured(e, 0.10, pair)
    assert judged.verdict == "pass" and judged.interval[0] < 0.90 < judged.ratio
    assert another_look(e, 0.10, pair) == 6  # as many again as ran
    assert another_look(e, 0.10) is None  # without the pair rule the estimate decides at once
    assert another_look(dataclasses.replace(e, looks=2), 0.10, pair) is None  # confirm_looks: 2
    clear = _evidence([0.99, 1.0, 1.01], stored=stored, again=_measured([1.0, 0.98, 1.02]))
    assert another_look(clear, 0.10, pair) is None  # a clear pass is answered
    # the look moves the estimate to where the drop is: judged on all twelve, a regression
    looked = dataclasses.replace(
        e, again=e.again.joined(_measured([0.86, 0.85, 0.87, 0.86, 0.84, 0.86])), looks=1
    )
    assert _verdict(speedup_item(looked, 0.10, pair)) == "regression"


def test_a_measurement_joined_with_its_repeat_pools_every_repeat():
    a = _measured([0.8, 0.9, 1.0], rates=(10.0, 11.0, 12.0), clean=[0.9], clean_share=0.5)
    b = _measured([1.1, 1.2, 1.3], mismatches=1, rates=(13.0, 14.0, 15.0), clean=[1.2], clean_share=1.0)
    j = a.joined(b)
    assert j.speedups == [0.8, 0.9, 1.0, 1.1, 1.2, 1.3] and j.metrics.speedup == pytest.approx(1.05)
    assert j.rates == [10.0, 11.0, 12.0, 13.0, 14.0, 15.0] and j.metrics.tokens_per_s == pytest.approx(12.5)
    assert j.clean_speedups == [0.9, 1.2] and j.clean_share == pytest.approx(0.75) and j.mismatches == 1
    assert j.metrics.repeats == a.metrics.repeats + b.metrics.repeats
    assert a.speedups == [0.8, 0.9, 1.0]  # neither is changed
    assert a.joined(_measured([1.0])).clean_share is None  # one not accounted: the pool is not


def test_beside_other_work_the_confirmation_takes_the_repeats_that_give_three_unpreempted_ones():
    m = _measured([0.85, 0.88, 0.80], clean=[0.99], clean_share=0.4)
    assert confirm_repeats(m, 3, shared=True) == 5  # 2 more at 0.4 a repeat
    assert confirm_repeats(_measured([0.85, 0.88, 0.80], clean=[], clean_share=0.0), 3, shared=True) == 3
    assert confirm_repeats(m, 3) == 12  # quiet: by the spread, as before


# ------------------------------------------------------------------- batch rows, weights, the report


def test_a_batch_rows_items_are_named_by_its_batch_size_and_judged_alike():
    items = _items(_evidence([0.74, 0.75, 0.76], SHARED_LOAD, where=" @ B=4"))
    assert set(items) == {
        "speedup @ B=4",
        "acceptance_rate @ B=4",
        "greedy exactness @ B=4",
        "tokens_per_s @ B=4",
        "baseline_tokens_per_s @ B=4",
    }
    assert _verdict(items["speedup @ B=4"]) == "inconclusive"


def test_changed_target_weights_fail():
    assert weights_item("abc", "abc").ok
    item = weights_item("abc", "def")
    assert not item.ok and item.note == "the target model files changed"


def test_a_regression_fails_the_report_and_an_inconclusive_item_alone_is_exit_6():
    report = CheckReport("p.yaml", "cfg", items=judge_config(_evidence([0.5, 0.6, 0.55]), 0.10))
    assert not report.passed and not report.inconclusive
    report = CheckReport("p.yaml", "cfg", items=judge_config(_evidence([0.5, 0.6, 0.55], BUSY), 0.10))
    assert report.passed and report.inconclusive


# ------------------------------------------------------- under load: unpreempted prompts (preemption)

# What one core of two kept busy did to an unchanged setup: every repeat read 0.63-0.89x of stored
# (the load slows the draft's many small operations more than the target's), while the prompts no
# other process preempted still read the stored speedup.
LOADED = [0.70, 0.80, 0.75]


def test_beside_other_work_an_unchanged_setup_passes_on_its_unpreempted_prompts():
    m = _measured(LOADED, clean=[1.0, 1.01, 0.99], clean_share=0.5, waited=0.3)
    for load in (SHARED_LOAD, BUSY):
        item = speedup_item(_evidence(measured=m, load=load), 0.10)
        assert _verdict(item) == "pass" and "rebuilt from prompts no other process preempted" in item.note


def test_beside_other_work_a_slower_speculative_side_fails_on_its_unpreempted_prompts():
    # the planted 15 % slower speculative side: its unpreempted prompts read 0.87x
    m = _measured([0.62, 0.70, 0.66], clean=[0.87, 0.865, 0.872], clean_share=0.5, waited=0.3)
    assert _verdict(speedup_item(_evidence(measured=m, load=SHARED_LOAD), 0.10)) == "regression"


def test_a_uniform_slowdown_of_both_sides_passes_and_one_sides_fails():
    # Load that slows plain and speculative decoding alike leaves their ratio: pass; the same
    # slowdown of the speculative side alone: regression, on a quiet machine as beside other work.
    plain, spec = [2.0, 2.02, 1.98], [1.0, 1.0, 1.0]  # seconds per repeat
    uniform = [p * 1.4 / (s * 1.4) for p, s in zip(plain, spec, strict=True)]
    one_side = [p / (s * 1.15) for p, s in zip(plain, spec, strict=True)]
    stored = _stored(speedup=2.0, samples=(2.0, 2.01, 1.99))
    ok = _measured(uniform, clean=uniform, clean_share=1.0)
    bad = _measured(one_side, clean=one_side, clean_share=1.0)
    for load in (QUIET, SHARED_LOAD):
        assert _verdict(speedup_item(_evidence(measured=ok, load=load, stored=stored), 0.10)) == "pass"
        assert _verdict(speedup_item(_evidence(measured=bad, load=load, stored=stored), 0.10)) == "regression"


def test_on_a_quiet_machine_the_answer_asks_for_repeats_alone():
    """Quiet already (the check slice's own core included): "or a quiet machine" would ask for
    what the check had."""
    e = _evidence([0.85, 0.95, 0.82], stored=_stored(speedup=1.0, samples=(1.0, 1.01, 0.99)))
    item = speedup_item(e, 0.10)
    assert _verdict(item) == "inconclusive" and item.answer == "about 25 more repeats (--repeats 28)"


def test_beside_other_work_too_few_unpreempted_prompts_is_inconclusive_and_says_how_many_repeats():
    m = _measured(LOADED, clean=[1.0], clean_share=0.25, waited=0.4)
    item = speedup_item(_evidence(measured=m, load=SHARED_LOAD), 0.10)
    assert _verdict(item) == "inconclusive"
    assert item.answer == "about 9 more repeats (--repeats 12) or a quiet machine"
    report = CheckReport("p.yaml", "cfg", items=[item])
    assert report.inconclusive_line == f"speedup: {item.answer} would answer"


def test_a_load_that_never_leaves_our_cores_is_inconclusive_asking_for_a_quiet_machine():
    m = _measured(LOADED, clean=[], clean_share=0.0, waited=0.48)
    item = speedup_item(_evidence(measured=m, load=BUSY), 0.10)
    assert _verdict(item) == "inconclusive"
    assert item.answer == "a quiet machine (our threads waited 48% of the time for a CPU)"


def test_without_preemption_accounting_a_loaded_drop_stays_inconclusive():
    # no schedstat (clean_share None): the rule before accounting, a drop beside other work decides nothing
    item = speedup_item(_evidence(measured=_measured(LOADED), load=SHARED_LOAD), 0.10)
    assert _verdict(item) == "inconclusive" and item.answer == "a quiet machine"


def test_on_a_quiet_machine_every_repeat_is_judged_not_only_the_unpreempted_ones():
    m = _measured([0.5, 0.6, 0.55], clean=[1.0, 1.0, 1.0], clean_share=1.0)
    assert _verdict(speedup_item(_evidence(measured=m), 0.10)) == "regression"


def test_enough_unpreempted_repeats_but_too_noisy_asks_for_the_repeats_their_spread_needs():
    # the smoke run's planted check: 4 unpreempted repeats (75 % of prompts) straddling the floor
    m = _measured([0.75, 0.80, 0.82], clean=[0.80, 0.88, 0.96, 0.84, 0.92], clean_share=0.75)
    item = speedup_item(_evidence(measured=m, load=SHARED_LOAD), 0.10)
    assert _verdict(item) == "inconclusive" and "too noisy to tell" in item.note
    # cv 7.2 %: 12 repeats like these answer against the stored side; at 0.75 of them unpreempted, 16
    assert item.answer == "about 13 more repeats (--repeats 16) or a quiet machine"


def test_a_quiet_check_too_noisy_to_resolve_names_the_tolerance_it_resolves():
    # quiet already, and no count of repeats up to 30 answers: "a quiet machine" would say nothing,
    # the interval's width is the drop this check resolves here, and at that tolerance it answers
    e = _evidence([0.6, 1.3, 0.85, 1.2, 0.7])
    item = speedup_item(e, 0.10)
    assert _verdict(item) == "inconclusive"
    lo, hi = judge_measured(e, 0.10).interval
    wide = math.ceil(100 * (hi - lo)) / 100
    tol = f"--tolerance {wide:.2f}, what a quiet machine resolves here (the speedup varied 33% from repeat to repeat"
    # judged against the run's stored repeats (one process's): a reference in fresh processes may answer
    assert item.answer.startswith(f"`specdec-tune reference` or {tol}")
    assert _verdict(speedup_item(e, wide)) != "inconclusive"


def test_a_quiet_check_against_a_reference_names_only_the_tolerance_it_resolves():
    e = _evidence([0.6, 1.3, 0.85, 1.2, 0.7], reference={"speedup": [1.0, 1.02, 0.99]})
    item = speedup_item(e, 0.10)
    assert _verdict(item) == "inconclusive" and "reference" not in item.answer
    assert item.answer.startswith("--tolerance ") and "what a quiet machine resolves here" in item.answer


def test_greedy_exactness_fails_on_any_parted_prompt_of_an_exact_engine():
    assert _items(_evidence(measured=_measured([1.0])))["greedy exactness"].ok
    item = _items(_evidence(measured=_measured([1.0], mismatches=1)))["greedy exactness"]
    assert not item.ok and item.stored == 0 and item.measured == 1


def test_an_engine_not_token_exact_when_stored_fails_only_on_a_larger_share_parting():
    """vLLM verifies in bfloat16 here: 1 of 2 SmolLM2 prompts parted from the plain server's tokens
    when the profile was measured, and again in its check (which failed on it, every time)."""
    measured = _measured([1.0], mismatches=1)
    measured.exactness = {"prompts": 2}
    same = _items(_evidence(measured=measured, stored_divergence=(1, 2)))["greedy exactness"]
    assert same.ok and same.stored == 1 and "not token-exact" in same.note and "1 of 2 parted" in same.note
    more = _measured([1.0], mismatches=2)
    more.exactness = {"prompts": 2}
    assert not _items(_evidence(measured=more, stored_divergence=(1, 2)))["greedy exactness"].ok
    # over another number of prompts, the share: 1 of 2 allows 4 of 8, not 5
    four, five = _measured([1.0], mismatches=4), _measured([1.0], mismatches=5)
    four.exactness = five.exactness = {"prompts": 8}
    assert _items(_evidence(measured=four, stored_divergence=(1, 2)))["greedy exactness"].ok
    assert not _items(_evidence(measured=five, stored_divergence=(1, 2)))["greedy exactness"].ok


def test_the_stored_divergence_is_the_profiles_for_its_best_config_only():
    from specdec_tune.app.check_rows import stored_divergence

    exactness = {"config": "ngram:4 γ=8", "prompts": 2, "identical": 1, "token_exact": False}
    p = SimpleNamespace(backend=SimpleNamespace(exactness=exactness))
    assert stored_divergence(p, SimpleNamespace(config=SimpleNamespace(label="ngram:4 γ=8"))) == (1, 2)
    assert stored_divergence(p, SimpleNamespace(config=SimpleNamespace(label="ngram:4 γ=5"))) == (0, 0)
    p = SimpleNamespace(backend=SimpleNamespace(exactness={}))
    assert stored_divergence(p, SimpleNamespace(config=SimpleNamespace(label="ngram:4 γ=8"))) == (0, 0)
