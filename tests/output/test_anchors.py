"""Other hardware or a regression: the anchors' verdict and the judged tokens/s (no models, no timing)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from specdec_tune.domain import Anchors, Metrics
from specdec_tune.measure.anchors import MachineSpeed, faster
from specdec_tune.measurement import Measurement
from specdec_tune.output.anchors import anchor_verdict, other_hardware_message
from specdec_tune.output.check import Evidence, needs_confirmation, rate_items
from specdec_tune.output.environment import BUSY, QUIET, SHARED, Environment, load_of
from specdec_tune.output.rates import SHARED_RATE


def _profile(**anchors):
    return SimpleNamespace(anchors=Anchors(**{"plain_tokens_per_s": 80.0, **anchors}), noise=None)


def _metrics(tokens=100.0, baseline=80.0, speedup=1.25):
    return Metrics(tokens, baseline, speedup, 0.02, 0.5, 2.0, speedup_samples=[speedup])


def _measured(rates, baseline_rates, speedups=(1.25, 1.26, 1.24)):
    metrics = _metrics(sorted(rates)[1], sorted(baseline_rates)[1], sorted(speedups)[1])
    return Measurement(metrics, 10, 0, list(speedups), rates=list(rates), baseline_rates=list(baseline_rates))


MACHINE = {"copy_bandwidth_gbps": 20.0, "matmul_gflops": 100.0}
STORED = SimpleNamespace(config=None, metrics=_metrics())


def _evidence(measured, busy=False, scale=1.0, reference=None, judge_rates=True):
    """What check gathered: the stored metrics, `measured`, on a quiet (or not quiet) machine."""
    env = Environment(BUSY if busy else QUIET)
    return Evidence(
        STORED,
        measured,
        environment=env,
        judge_rates=judge_rates,
        rate_scale=scale,
        reference=reference or {},
    )


def _rates(measured, busy=False, scale=1.0, reference=None):
    return rate_items(_evidence(measured, busy, scale, reference), 0.10)


def test_the_matmul_anchor_decides_and_copy_is_reported():
    p = _profile(**MACHINE)
    same = anchor_verdict(p, 68.0, MachineSpeed(21.0, 95.0, 0.05), machine_busy=False)
    assert same.by == "machine anchors" and not same.other_hardware and same.judge_rates
    assert same.slowdown == pytest.approx(100 / 95)
    # copy bandwidth alone drifting (as it did 76 -> 43 GB/s on one shared VM) is not other hardware
    drift = anchor_verdict(p, 68.0, MachineSpeed(11.0, 98.0, 0.05), machine_busy=False)
    assert not drift.other_hardware and drift.compared["copy_bandwidth_gbps"] == [20.0, 11.0]
    slower = anchor_verdict(p, 80.0, MachineSpeed(20 / 1.8, 100 / 1.8, 0.05), machine_busy=False)
    assert slower.other_hardware and not slower.judge_rates and slower.slowdown == pytest.approx(1.8)
    assert "other hardware (measured 1.80× slower: copy 11.1 GB/s" in other_hardware_message("p.yaml", slower)
    quicker = anchor_verdict(p, 80.0, MachineSpeed(40.0, 200.0, 0.05), machine_busy=False)
    assert quicker.other_hardware and "2.00× faster" in other_hardware_message("p.yaml", quicker)
    # Only one machine anchor on each side in common (an older copy-only profile): it decides alone.
    copy_only = anchor_verdict(_profile(copy_bandwidth_gbps=20.0), 80.0, MachineSpeed(10.0, 100.0), False)
    assert copy_only.slowdown == pytest.approx(2.0) and set(copy_only.compared) >= {"copy_bandwidth_gbps"}


def test_a_profile_measured_on_the_check_slice_compares_the_slices_own_matmul_rate():
    """The run's anchors ran on every core; a check on the slice (measure.narrow, one thread)
    measures about half of that matmul rate on two cores, which is not other hardware: it is
    compared with what the reference processes measured on the slice, and copy is not compared."""
    ref = [2.0, 2.1, 2.05]
    sliced = _profile(**MACHINE, reference_matmul_gflops=52.0, reference_threads=1, reference_speedups=ref)
    assert sliced.anchors.sliced
    same = anchor_verdict(sliced, 0.0, MachineSpeed(11.0, 50.0, 0.05), machine_busy=False)
    assert not same.other_hardware and same.slowdown == pytest.approx(52 / 50)
    assert set(same.compared) == {"matmul_gflops"}
    slower = anchor_verdict(sliced, 0.0, MachineSpeed(11.0, 52 / 1.8, 0.05), machine_busy=False)
    assert slower.other_hardware and slower.slowdown == pytest.approx(1.8)
    # The same numbers against a reference measured on every core: other hardware (2x slower).
    wide = _profile(**MACHINE, reference_matmul_gflops=100.0, reference_speedups=ref)
    assert not wide.anchors.sliced
    assert anchor_verdict(wide, 0.0, MachineSpeed(11.0, 50.0, 0.05), machine_busy=False).other_hardware
    # Without a matmul rate on the slice, plain decoding decides, against the slice's own plain rate.
    ref = {"reference_baseline_tokens_per_s": [40.0, 42.0, 41.0], "reference_tokens_per_s": [80.0] * 3}
    plain = _profile(reference_threads=1, reference_speedups=[2.0] * 3, **ref)  # the run's: 80 tokens/s
    same = anchor_verdict(plain, 40.0, None, machine_busy=False)
    assert not same.other_hardware and same.compared["plain_tokens_per_s"] == [41.0, 40.0]


def test_load_explains_slow_anchors_and_their_own_noise_widens_the_tolerance():
    p = _profile(**MACHINE)
    busy = anchor_verdict(p, 40.0, MachineSpeed(10.0, 50.0, 0.05), machine_busy=True)
    assert not busy.other_hardware and busy.judge_rates  # judged, and a drop is inconclusive
    noisy = anchor_verdict(p, 80.0, MachineSpeed(20 / 1.5, 100 / 1.5, 0.6, 0.6), machine_busy=False)
    assert noisy.tolerance == pytest.approx(0.6) and not noisy.other_hardware
    # A noisy copy bandwidth (one VM's moved 43 <-> 78 GB/s) does not widen the matmul's tolerance:
    # 1.55x slower by the matmul is other hardware, as the emulated slower machine's third check was.
    copy_noisy = anchor_verdict(p, 80.0, MachineSpeed(20 / 1.55, 100 / 1.55, 0.7, 0.04), False)
    assert copy_noisy.tolerance == pytest.approx(0.3) and copy_noisy.other_hardware
    assert faster(MachineSpeed(1.0, 2.0, 0.5, 0.2), MachineSpeed(2.0, 1.0, 0.3, 0.1)).matmul_spread == 0.1


def test_without_machine_anchors_plain_decoding_decides_and_rates_are_not_judged():
    p = _profile()
    v = anchor_verdict(p, 80 / 1.8, MachineSpeed(20.0, 100.0), machine_busy=False)
    assert v.by == "plain tokens/s" and v.other_hardware and not v.judge_rates
    assert "plain decoding 44.4 tokens/s" in other_hardware_message("p.yaml", v)
    v = anchor_verdict(p, 68.0, MachineSpeed(20.0, 100.0), machine_busy=False)  # 15 % slower target
    assert not v.other_hardware and not v.judge_rates
    none = anchor_verdict(SimpleNamespace(anchors=None, noise=None), 68.0, MachineSpeed(20.0, 100.0), False)
    assert none.slowdown is None and not none.other_hardware and not none.judge_rates


def test_a_clearly_lower_rate_is_a_regression_and_information_only_when_not_quiet():
    slower = _measured([85.0, 86.0, 84.5], [68.0, 68.5, 67.6])
    items = {i.metric: i for i in _rates(slower)}
    assert not items["baseline_tokens_per_s"].ok
    assert items["baseline_tokens_per_s"].measured == pytest.approx(68.0)
    # The speculative rate is the speedup times the plain rate: reported, never judged on its own.
    assert items["tokens_per_s"].ok and items["tokens_per_s"].note.startswith("information only")
    assert items["tokens_per_s"].measured == pytest.approx(85.0)
    items = {i.metric: i for i in _rates(slower, busy=True)}  # the host's: reported, not judged
    assert items["baseline_tokens_per_s"].ok and not items["baseline_tokens_per_s"].inconclusive
    assert items["baseline_tokens_per_s"].note == SHARED_RATE
    same = _measured([99.0, 101.0, 100.0], [79.0, 81.0, 80.0])
    assert all(i.ok and not i.inconclusive for i in _rates(same))
    # Judged rates ask for the confirming measurement; the speedup alone would not.
    assert needs_confirmation(_evidence(slower), 0.10)
    assert not needs_confirmation(_evidence(slower, judge_rates=False), 0.10)


def test_rates_are_judged_at_the_profiles_machine_speed():
    # The machine anchors agree (5 % faster now, within the tolerance) and the target is 15 % slower:
    # 80 -> 73.9 tokens/s plain is -7.6 % raw (a pass at 10 %), but -12.2 % at the profile's speed.
    p = _profile(**MACHINE)
    v = anchor_verdict(p, 73.9, MachineSpeed(20.0, 105.0, 0.05), machine_busy=False)
    assert v.judge_rates and not v.other_hardware and v.rate_scale == pytest.approx(100 / 105)
    assert v.as_dict()["rate_scale"] == pytest.approx(0.9524, abs=1e-4)
    slower = _measured([93.0, 93.5, 92.5], [73.9, 74.2, 73.6])
    assert all(i.ok for i in _rates(slower))
    items = {i.metric: i for i in _rates(slower, scale=v.rate_scale)}
    assert not items["baseline_tokens_per_s"].ok
    assert items["baseline_tokens_per_s"].measured == pytest.approx(73.9)  # reported unscaled
    assert "scaled ×0.952" in items["baseline_tokens_per_s"].note
    assert needs_confirmation(_evidence(slower, scale=v.rate_scale), 0.10)
    # The same machine measured 5 % slower: an unchanged target passes once scaled.
    v = anchor_verdict(p, 76.2, MachineSpeed(20.0, 95.0, 0.05), machine_busy=False)
    same = _measured([95.0, 95.4, 94.6], [76.2, 76.0, 76.5])
    assert all(i.ok for i in _rates(same, scale=v.rate_scale))
    # Other hardware, or no machine anchors: nothing is scaled.
    assert anchor_verdict(p, 80.0, MachineSpeed(20.0, 50.0, 0.05), machine_busy=False).rate_scale == 1.0
    assert anchor_verdict(_profile(), 80.0, MachineSpeed(20.0, 50.0), machine_busy=False).rate_scale == 1.0


def test_the_load_and_the_faster_of_two_measurements():
    assert load_of({"others_cpu_share": 0.05, "steal_share": 0.0}) == QUIET
    assert load_of({"others_cpu_share": 0.2, "steal_share": 0.0}) == SHARED
    assert load_of({"others_cpu_share": None, "steal_share": 0.2}) == BUSY
    assert load_of({}, busy_seen=True) == BUSY
    assert faster(MachineSpeed(10.0, 90.0, 0.3), MachineSpeed(12.0, 80.0, 0.1)) == MachineSpeed(
        12.0, 90.0, 0.1
    )


def test_the_profile_keeps_matmul_gflops_and_older_profiles_load_without_it(tmp_path):
    import yaml
    from helpers import make_sample_profile

    from specdec_tune.errors import SpecDecError
    from specdec_tune.store.yamlio import load_profile, profile_to_dict, save_profile

    p = make_sample_profile()
    p.anchors = Anchors(80.0, 20.0, 150.0)
    assert load_profile(save_profile(p, tmp_path / "p.yaml")).anchors == p.anchors
    data = profile_to_dict(p)
    data["anchors"] = {"plain_tokens_per_s": 80.0, "copy_bandwidth_gbps": 20.0}  # written before
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    assert load_profile(tmp_path / "old.yaml").anchors.matmul_gflops is None
    data["anchors"]["matmul_gflops"] = -1.0
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(SpecDecError, match=r"anchors\.matmul_gflops"):
        load_profile(tmp_path / "bad.yaml")


def test_rates_judged_against_the_reference_read_at_the_reference_processes_speed():
    from specdec_tune.output.anchors import rate_scale_for

    machine = MachineSpeed(20.0, 95.0, 0.02)
    # The run's own anchor said 100 GFLOP/s; its fresh reference processes measured 96, as fresh
    # processes do: a check measuring 95 is at the reference's speed within 1 %, not 5 %.
    ref = _profile(
        **MACHINE,
        reference_tokens_per_s=[110.0, 111.0],
        reference_baseline_tokens_per_s=[88.0, 87.0],
        reference_matmul_gflops=96.0,
    )
    v = anchor_verdict(ref, 80.0, machine, machine_busy=False)
    assert v.rate_scale == pytest.approx(100 / 95) and rate_scale_for(ref, v, machine) == pytest.approx(
        96 / 95
    )
    # Without a reference (or its matmul), the run's anchor as before.
    old = _profile(**MACHINE)
    assert rate_scale_for(old, anchor_verdict(old, 80.0, machine, False), machine) == pytest.approx(100 / 95)
    # Other hardware: nothing is scaled at all.
    far = MachineSpeed(20.0, 50.0, 0.02)
    assert rate_scale_for(ref, anchor_verdict(ref, 80.0, far, False), far) == 1.0


def test_measure_twice_says_how_far_the_matmul_moved(monkeypatch):
    from specdec_tune.measure import anchors

    seen = iter([MachineSpeed(20.0, 100.0, 0.02, 0.01), MachineSpeed(22.0, 90.0, 0.03, 0.02)])
    monkeypatch.setattr(anchors, "machine_speed", lambda device: next(seen))
    both, result = anchors.measure_twice("cpu", lambda: "done")
    assert result == "done" and both.matmul_gflops == 100.0 and both.copy_bandwidth_gbps == 22.0
    assert both.drift == pytest.approx(0.1) and anchors.drift([100.0]) == 0.0


def test_the_plain_rate_per_decode_anchor_step_cancels_the_hosts_speed():
    """Measured beside a decode anchor, the plain rate is judged by its ratio to the anchor's
    against the reference's ratio: a slower host is no regression, a slower target is one."""
    reference = {
        "tokens_per_s": [100.0, 100.5, 99.5],
        "baseline_tokens_per_s": [80.0, 80.5, 79.5],
        "speedup": [1.25, 1.26, 1.24],
        "plain_per_anchor": [0.70, 0.705, 0.695],
    }

    def judged(baseline, per_anchor, busy=False):
        m = _measured([85.0, 86.0, 84.5], baseline)
        m.plain_per_anchor = list(per_anchor)
        items = {i.metric: i for i in _rates(m, busy, reference=reference)}
        return m, items["baseline_tokens_per_s"]

    slow_host, item = judged([64.0, 64.5, 63.8], [0.70, 0.702, 0.699])
    assert item.ok and not item.inconclusive and item.measured == 64.0 and item.stored == 80.0
    assert "per decode-anchor step" in item.note
    assert not needs_confirmation(_evidence(slow_host, reference=reference), 0.10)
    slow_target, item = judged([80.0, 80.5, 79.8], [0.595, 0.597, 0.594])  # the host 15 % faster
    assert not item.ok and not item.inconclusive
    assert needs_confirmation(_evidence(slow_target, reference=reference), 0.10)
    loaded, item = judged([68.0, 68.5, 67.6], [0.595, 0.597, 0.594], busy=True)
    assert item.ok and item.note == SHARED_RATE  # other work, no unpreempted prompts: not judged
    loaded.clean_plain_per_anchor = [0.595, 0.597, 0.594]  # ... but rebuilt from unpreempted ones: judged
    e = _evidence(loaded, busy=True, reference=reference)
    assert not {i.metric: i for i in rate_items(e, 0.10)}["baseline_tokens_per_s"].ok
    # measured without the anchor (or a reference without its ratio): the absolute rate decides
    m = _measured([85.0, 86.0, 84.5], [64.0, 64.5, 63.8])
    items = {i.metric: i for i in _rates(m, reference=reference)}
    assert not items["baseline_tokens_per_s"].ok
    assert "per decode-anchor step" not in items["baseline_tokens_per_s"].note
