"""Runtime scales: fitted from measured timelines, applied to predictions, checked out of sample."""

from __future__ import annotations

import warnings
from dataclasses import replace

import pytest

from executor.host_memory import pin_malloc_thresholds
from pipeline.calibration.agreement import (
    PlanComparison,
    block_medians,
    compare_plans,
    cross_validated,
    fidelity_summary,
    rank_agreement,
)
from pipeline.calibration.fidelity import (
    SCALE_KEYS,
    calibrate,
    calibrated_profile,
    calibration_plans,
    fit_runtime_scales,
    runtime_profile,
)
from pipeline.plan import parse_action
from pipeline.simulator import simulate
from pipeline.spec import Cluster, ModelProfile
from tests.executor.plans import named_plans

TRUE_SCALES = {"F": 0.9, "I": 1.2, "W": 1.4, "W0": 1.05, "B": 0.8}


def _measured_profile() -> ModelProfile:
    """tiny-hybrid's analytic costs restated in ms with a fused-backward time per layer."""
    from tests.executor.plans import tiny_profile

    prof = tiny_profile()
    k = prof.seconds_per_unit * 1e3
    layers = tuple(replace(x, f=x.f * k, b=x.b * k, w=x.w * k, extra={**x.extra, "b_full": 0.8 * (x.b + x.w) * k})
                   for x in prof.layers)
    return replace(prof, layers=layers, time_unit="ms")


def _runs_with(scales: dict[str, float], plans, profile: ModelProfile, cluster: Cluster) -> list[dict]:
    """What a replay would report if the runtime spent exactly the scaled costs, plus the
    per-action overhead between actions (outside the timed compute, as in the executor)."""
    over, ends = scales.get("overhead", 0.0), scales.get("transfer", 0.0)
    runs = []
    for _, plan in plans:
        res = simulate(plan, runtime_profile(profile, plan, scales), cluster)
        timeline = res.timeline_dict()
        place, last = plan.placement, plan.num_stages - 1
        for e in timeline["events"]:  # compute only: a fused B carries two overheads (I + W)
            s, op, _ = parse_action(e["action"])
            crossings = 0 if op == "W" else (
                (s > 0 and place[s - 1] != place[s]) + (s < last and place[s + 1] != place[s]))
            e["end"] -= over * (2 if op == "B" else 1) + ends * crossings
        runs.append({"measured_iteration_time": res.iteration_time, "timeline": timeline})
    return runs


def test_fit_recovers_the_runtime_scales() -> None:
    profile, cluster = _measured_profile(), Cluster(devices=2)
    plans = named_plans(4)
    fitted = fit_runtime_scales(plans, profile, _runs_with(TRUE_SCALES, plans, profile, cluster))
    assert set(fitted) == set(SCALE_KEYS)
    for key, value in TRUE_SCALES.items():
        assert fitted[key] == pytest.approx(value, rel=1e-9)


def test_cross_validation_predicts_unseen_plans_and_the_raw_profile_does_not() -> None:
    profile, cluster = _measured_profile(), Cluster(devices=2)
    plans = named_plans(4)
    runs = _runs_with(TRUE_SCALES, plans, profile, cluster)
    raw = fidelity_summary(compare_plans(plans, profile, cluster, runs=runs))
    cv = fidelity_summary(cross_validated(plans, profile, cluster, runs=runs))
    assert raw["median_abs_error_pct"] > 3
    assert cv["median_abs_error_pct"] < 1e-6 and cv["same_order"]
    with pytest.raises(ValueError, match="two"):
        cross_validated(plans[:1], profile, cluster, runs=runs[:1])


def test_calibrate_recovers_scales_and_overhead() -> None:
    profile, cluster = _measured_profile(), Cluster(devices=2)
    truth = TRUE_SCALES | {"overhead": 0.05}
    calib = calibration_plans(profile, cluster, 4, count=6, seed=1)
    fitted = calibrate(calib, profile, cluster, runs=_runs_with(truth, calib, profile, cluster))
    for key in ("F", "I", "W", "W0"):
        assert fitted[key] == pytest.approx(truth[key], rel=1e-6)
    assert fitted["overhead"] == pytest.approx(0.05, rel=0.1)
    # Plans the calibration never saw are predicted within a fraction of a percent.
    plans = named_plans(4)
    runs = _runs_with(truth, plans, profile, cluster)
    held_out = fidelity_summary(cross_validated(plans, profile, cluster, runs=runs, calibration=(
        calib, _runs_with(truth, calib, profile, cluster))))
    assert held_out["max_abs_error_pct"] < 1.0 and held_out["same_order"]


def test_each_layers_own_factor_comes_from_the_stages_of_that_layer_alone() -> None:
    from pipeline.calibration.fidelity import fit_layer_scales, unit_plans

    profile, cluster = _measured_profile(), Cluster(devices=2)
    L = profile.num_layers
    units = unit_plans(profile, cluster, 4)
    assert [n for n, _ in units] == ["unit-split", "unit-fused"]
    for _, plan in units:  # every layer a stage, round-robin over the devices
        assert plan.partition == tuple((i, i + 1) for i in range(L))
        assert plan.placement == tuple(i % 2 for i in range(L))
    assert {a.op for acts in units[0][1].schedule for a in acts} == {"F", "I", "W"}
    assert {a.op for acts in units[1][1].schedule for a in acts} == {"F", "B"}
    # the runtime spends layer 3's F at 1.5x, layer 5's W at 0.7x and the head's fused B at 0.6x
    # on top of the per-operation factors: a mis-profiled layer that no per-operation factor expresses
    truth = TRUE_SCALES | {"F#3": 1.5, "W#5": 0.7, f"B#{L - 1}": 0.6}
    calib = calibration_plans(profile, cluster, 4, count=6, seed=1, units=True)
    assert [n for n, _ in calib[:2]] == ["unit-split", "unit-fused"] and len(calib) == 8
    runs = _runs_with(truth, calib, profile, cluster)
    own = fit_layer_scales(calib, profile, runs)
    assert own["F#3"] == pytest.approx(0.9 * 1.5, rel=1e-6) and own["W#5"] == pytest.approx(1.4 * 0.7, rel=1e-6)
    assert own[f"B#{L - 1}"] == pytest.approx(0.8 * 0.6, rel=1e-6) and "W0#0" not in own
    fitted = calibrate(calib, profile, cluster, runs=runs, layers=True)
    for key in ("F", "I", "W", "B"):  # what is left on top of the layers' own: next to nothing (the
        assert fitted[key] == pytest.approx(1.0, rel=0.01), key  # first layer has no factor of its own)
    assert fitted["W0"] == pytest.approx(1.05, rel=0.01)  # the first stage's W: its layers' fused B's deviations
    plans = named_plans(4)
    unseen = _runs_with(truth, plans, profile, cluster)
    with_layers = fidelity_summary(cross_validated(plans, profile, cluster, runs=unseen, calibration=(calib, runs),
                                                   layers=True))
    without = fidelity_summary(cross_validated(plans, profile, cluster, runs=unseen, calibration=(calib, runs)))
    assert with_layers["max_abs_error_pct"] < 0.5 and without["max_abs_error_pct"] > 1.0
    baked = calibrated_profile(profile, fitted)
    assert baked.layers[3].f == pytest.approx(profile.layers[3].f * fitted["F"] * fitted["F#3"], rel=1e-9)
    assert baked.layers[3].f == pytest.approx(profile.layers[3].f * 0.9 * 1.5, rel=0.01)


def test_calibrate_recovers_how_a_stages_w_grows_with_its_depth() -> None:
    from pipeline.calibration.fidelity import fit_w_depth

    profile, cluster = _measured_profile(), Cluster(devices=2)
    truth = TRUE_SCALES | {"w_depth": 0.2}
    calib = calibration_plans(profile, cluster, 4, count=8, seed=3)
    runs = _runs_with(truth, calib, profile, cluster)
    assert fit_w_depth(calib, profile, runs) == pytest.approx({"W": 1.4, "w_depth": 0.2}, rel=1e-6)
    fitted = calibrate(calib, profile, cluster, runs=runs)
    assert fitted["w_depth"] == pytest.approx(0.2, rel=1e-6) and fitted["W"] == pytest.approx(1.4, rel=1e-6)
    assert calibrated_profile(profile, fitted).w_depth == fitted["w_depth"]
    assert "w_depth" not in calibrate(calib, profile, cluster, runs=runs, depth=False)
    flat = _runs_with(TRUE_SCALES, calib, profile, cluster)  # no depth in the runtime: none fitted
    assert fit_w_depth(calib, profile, flat) == pytest.approx({"W": 1.4, "w_depth": 0.0}, abs=1e-9)
    plans = named_plans(4)
    unseen = _runs_with(truth, plans, profile, cluster)
    held_out = fidelity_summary(cross_validated(plans, profile, cluster, runs=unseen, calibration=(calib, runs)))
    assert held_out["max_abs_error_pct"] < 0.5


def test_calibrate_recovers_the_time_each_layer_adds_to_an_operation() -> None:
    from pipeline.calibration.fidelity import fit_operation_terms, layer_overhead_key, uncontended

    profile, cluster = _measured_profile(), Cluster(devices=2)
    per_layer = {"I+": 0.05, "W+": 0.03, "B+": 0.08}
    truth = TRUE_SCALES | per_layer | {"w_depth": 0.1}
    calib = calibration_plans(profile, cluster, 4, count=8, seed=3)
    runs = _runs_with(truth, calib, profile, cluster)
    fitted = fit_operation_terms(calib, profile, runs)
    assert fitted["F+"] == pytest.approx(0.0, abs=1e-9) and fitted["W0+"] == pytest.approx(0.0, abs=1e-9)
    assert {key: fitted[key] for key in [*per_layer, "w_depth"]} == pytest.approx(per_layer | {"w_depth": 0.1},
                                                                                   rel=1e-6)
    assert {key: fitted[key] for key in TRUE_SCALES} == pytest.approx(TRUE_SCALES, rel=1e-6)
    # a factor alone (per_layer=False) cannot: it spreads the layers' time by their size
    assert fit_operation_terms(calib, profile, runs, per_layer=False)["I"] != pytest.approx(1.2, rel=1e-3)
    fitted = calibrate(calib, profile, cluster, runs=runs)
    assert fitted["W+"] == pytest.approx(0.03, rel=1e-6)
    baked = calibrated_profile(profile, fitted)
    assert baked.layers[3].b == pytest.approx(profile.layers[3].b * fitted["I"] + 0.05, rel=1e-6)
    assert uncontended({"W+": 0.3, "W": 1.0}, {"W": 0.5}, 1.0) == pytest.approx({"W+": 0.2, "W": 1.0 / 1.5})
    assert layer_overhead_key("B") == "B+"
    two_stages = [(name, plan) for name, plan in named_plans(4) if plan.num_stages == 2][:1]
    few = fit_operation_terms(two_stages, profile, _runs_with(truth, two_stages, profile, cluster))
    assert few and all(few[key] == 0.0 for key in few if key.endswith("+"))  # too few stages: a factor alone
    plans = named_plans(4)
    unseen = _runs_with(truth, plans, profile, cluster)
    held_out = fidelity_summary(cross_validated(plans, profile, cluster, runs=unseen, calibration=(calib, runs)))
    assert held_out["max_abs_error_pct"] < 0.5


def test_a_search_on_the_calibrated_profile_prices_each_plan_as_its_replay_is_predicted() -> None:
    """The search simulates calibrated_profile; replays are predicted with runtime_profile, which
    prices the first stage's split backward as PyTorch runs it (I a no-op, W the whole backward):
    the two must agree, or the search optimises another model than the one its plans are judged by."""
    profile, cluster = _measured_profile(), Cluster(devices=2)
    scales = TRUE_SCALES | {"I+": 0.05, "W+": 0.03, "B+": 0.08, "W0+": 0.02, "w_depth": 0.1, "overhead": 0.01,
                            "transfer": 0.02}
    baked = calibrated_profile(profile, scales)
    plans = named_plans(4)
    assert any(plan.num_stages > 1 and any(a.op == "W" and a.stage == 0 for acts in plan.schedule for a in acts)
               for _, plan in plans)  # a plan whose first stage runs a split backward is among them
    for name, plan in plans:
        searched = simulate(plan, baked, cluster).iteration_time
        replayed = simulate(plan, runtime_profile(profile, plan, scales), cluster).iteration_time
        assert searched == pytest.approx(replayed, rel=1e-9), name
    assert "b_first" not in calibrated_profile(profile, {"F": 1.1}).layers[0].extra  # no W0 fitted: as profiled
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a known layer field: read back without a ProfileWarning
        assert ModelProfile.from_dict(baked.to_dict()).layers[0].extra["b_first"] == baked.layers[0].extra["b_first"]


def test_calibrate_recovers_the_transfer_overhead_too() -> None:
    profile, cluster = _measured_profile(), Cluster(devices=2)
    truth = TRUE_SCALES | {"overhead": 0.05, "transfer": 0.2}
    calib = calibration_plans(profile, cluster, 4, count=6, seed=1)
    fitted = calibrate(calib, profile, cluster, runs=_runs_with(truth, calib, profile, cluster))
    assert fitted["transfer"] == pytest.approx(0.2, rel=0.1)
    assert fitted["overhead"] == pytest.approx(0.05, rel=0.2)
    assert calibrated_profile(profile, fitted).transfer_overhead == fitted["transfer"]
    plans = named_plans(4)
    runs = _runs_with(truth, plans, profile, cluster)
    held_out = fidelity_summary(cross_validated(plans, profile, cluster, runs=runs,
                                                calibration=(calib, _runs_with(truth, calib, profile, cluster))))
    assert held_out["max_abs_error_pct"] < 1.0


def test_calibration_plans_are_random_but_reproducible() -> None:
    from pipeline.plan import validate_plan

    profile, cluster = _measured_profile(), Cluster(devices=2)
    a = calibration_plans(profile, cluster, 4, count=8, seed=3)
    assert [p for _, p in a] == [p for _, p in calibration_plans(profile, cluster, 4, count=8, seed=3)]
    assert len(a) == 8 and len({p.partition for _, p in a}) > 3
    fused = [any(x.op == "B" for acts in p.schedule for x in acts) for _, p in a]
    assert any(fused) and not all(fused)
    for _, p in a:
        validate_plan(p, num_layers=profile.num_layers, devices=2)
        assert {d for d in p.placement} == {0, 1}


def test_calibrated_profile_scales_each_kind() -> None:
    profile = _measured_profile()
    cal = calibrated_profile(profile, TRUE_SCALES)
    a, b = profile.layers[3], cal.layers[3]
    assert (b.f, b.b, b.w) == pytest.approx((0.9 * a.f, 1.2 * a.b, 1.4 * a.w))
    assert b.extra["b_full"] == pytest.approx(0.8 * a.extra["b_full"])
    assert cal.extra["runtime_scales"]["W"] == pytest.approx(1.4)
    assert calibrated_profile(profile, {"overhead": 0.2}).action_overhead == 0.2


def test_first_stage_w_is_its_whole_backward() -> None:
    profile = _measured_profile()
    plan = dict(named_plans(4))["zb-h1"]
    first = range(*plan.partition[0])
    rp = runtime_profile(profile, plan, {"W0": 2.0})
    for i in first:
        assert rp.layers[i].b == 0.0
        assert rp.layers[i].w == pytest.approx(2.0 * profile.layers[i].extra["b_full"])


def test_malloc_thresholds_pin_once() -> None:
    import sys

    first = pin_malloc_thresholds()
    assert pin_malloc_thresholds() == first
    if sys.platform.startswith("linux"):
        assert first  # glibc: what CI and the executor's workers run on


def _comparison(name: str, predicted: float, steps: list[float]) -> PlanComparison:
    import statistics

    return PlanComparison(name, predicted, statistics.median(steps), {}, {}, {"measured_iteration_times": steps})


def test_only_pairs_every_third_of_the_steps_orders_alike_count_as_resolved() -> None:
    steady_fast = _comparison("a", 10.0, [100.0, 101.0, 99.0] * 4)
    steady_slow = _comparison("b", 11.0, [110.0, 111.0, 109.0] * 4)
    # median 105, but one third of its steps is faster than "a": the job orders (a, c) both ways
    flipping = _comparison("c", 9.0, [105.0, 95.0, 106.0] * 4)
    got = rank_agreement([steady_fast, steady_slow, flipping])
    assert got["pairs"] == 3 and got["concordant_pairs"] == 2  # the model puts c before a: measured after
    assert got["resolved_pairs"] == 2  # (a, b) and (b, c); (a, c) is noise
    assert got["concordant_resolved"] == 2  # the one miss was the pair the measurement cannot order
    worse = rank_agreement([steady_fast, replace(steady_slow, predicted=8.0), flipping])
    assert worse["resolved_pairs"] == 2 and worse["concordant_resolved"] == 0  # b predicted first: both wrong
    assert block_medians(flipping) == [105.0, 95.0, 106.0]
    assert block_medians(_comparison("short", 1.0, [1.0, 2.0])) is None


def test_two_replays_of_one_plan_are_no_pair_and_set_the_jobs_noise_floor() -> None:
    from pipeline.calibration.agreement import copy_gap, plan_identity

    plans = dict(named_plans(4))
    one, other = plans["1f1b"].to_dict(), plans["zb-h1"].to_dict()
    a = replace(_comparison("a", 10.0, [100.0] * 6), run={"measured_iteration_times": [100.0] * 6, "plan": one})
    copy = replace(_comparison("a-copy", 10.0, [103.0] * 6),
                   run={"measured_iteration_times": [103.0] * 6, "plan": {**one, "meta": {"method": "copy"}}})
    near = replace(_comparison("b", 9.0, [102.5] * 6), run={"measured_iteration_times": [102.5] * 6, "plan": other})
    assert plan_identity(a) == plan_identity(copy) != plan_identity(near)  # the name and meta do not count
    assert copy_gap([a, copy, near]) == pytest.approx(0.03)
    got = rank_agreement([a, copy, near])
    assert got["copy_gap_pct"] == pytest.approx(3.0)
    # (a, copy) is no pair; (a, b) 2.5% apart and (copy, b) 0.5% (a tie) leave one pair, which the
    # model misses (it puts b first), but the job measured one plan 3% apart from itself
    assert (got["pairs"], got["concordant_pairs"]) == (1, 0)
    assert (got["pairs_beyond_copies"], got["concordant_beyond_copies"]) == (0, 0)
    without = rank_agreement([a, near])
    assert without["copy_gap_pct"] is None and without["pairs_beyond_copies"] == without["pairs"] == 1
    assert plan_identity(_comparison("no plan", 1.0, [1.0])) is None


def test_the_fidelity_benchmark_analyses_a_saved_replay_set_again(tmp_path, capsys) -> None:
    from experiments.benchmarks.predicted_vs_measured import load_replay_set, main, save_replay_set

    profile, cluster = _measured_profile(), Cluster(devices=2, latency_us=60.0, p2p_gbps=4.0)
    plans, calib = named_plans(4), calibration_plans(profile, cluster, 4, count=3, seed=1)
    scales = {**TRUE_SCALES, "overhead": 0.05, "transfer": 0.1}
    runs = _runs_with(scales, plans + calib, profile, cluster)
    for (_, plan), run in zip(plans + calib, runs):
        run["plan"] = plan.to_dict()
    result = {"profile": profile.to_dict(), "p2p": {"latency_us": 60.0, "p2p_gbps": 4.0, "backend": "gloo"},
              "runs": runs, "backend": "gloo", "threads": 1, "job": {"model": "tiny-hybrid", "lowering": "early"}}
    path = tmp_path / "set.json"
    save_replay_set(path, plans, calib, result=result)
    back_plans, back_calib, back = load_replay_set(path)
    assert [n for n, _ in back_plans] == [n for n, _ in plans] and len(back_calib) == 3
    assert [p.schedule for _, p in back_plans] == [p.schedule for _, p in plans]
    assert main(["--from", str(path), "--tuner-calls", "0", "--copy", ""]) == 0
    out = capsys.readouterr().out
    assert "calibrated on 3 random plans" in out and "measured order" in out
    (tmp_path / "bad.json").write_text('{"version": 7}')
    with pytest.raises(SystemExit):
        main(["--from", str(tmp_path / "bad.json")])
    assert "not a replay set written by --save" in capsys.readouterr().err


def test_stage_factors_read_each_stages_measured_compute_over_its_profile() -> None:
    from experiments.benchmarks.predicted_vs_measured import stage_factors

    profile, cluster = _measured_profile(), Cluster(devices=2)
    plans = named_plans(4)
    runs = _runs_with({"F": 1.5, "I": 1.0, "W": 2.0, "W0": 2.0, "B": 0.5}, plans, profile, cluster)
    got = stage_factors(plans, profile, runs)
    assert set(got) == {name for name, _ in plans}
    for name, row in got.items():
        assert row, name
        for key, factor in row.items():  # "2F[3:5]": the op's own scale comes back
            op = key.split("[")[0].lstrip("0123456789")
            assert factor == pytest.approx({"F": 1.5, "I": 1.0, "W": 2.0, "B": 0.5}[op], rel=1e-6), key


def test_overlap_factors_split_each_operation_by_what_the_other_rank_did() -> None:
    from experiments.benchmarks.predicted_vs_measured import overlap_factors

    profile, cluster = _measured_profile(), Cluster(devices=2)
    plans = named_plans(4)
    runs = _contended(_runs_with({"F": 1.0, "I": 1.0, "W": 1.0, "W0": 1.0, "B": 1.0}, plans, profile, cluster), 0.5)
    got = overlap_factors(plans, profile, runs)
    for key, row in got.items():  # alone: the profile; fully beside the other rank: about 1.5x
        if row["alone_n"]:
            assert row["alone"] < 1.15, key
        if row["beside_n"]:
            assert row["beside"] > 1.3, key
    assert any(row["alone_n"] for row in got.values()) and any(row["beside_n"] for row in got.values())


def test_per_kind_factors_move_toward_each_kinds_own_and_help_the_fit() -> None:
    """A head whose fused backward runs at half its profile and blocks at 1.6x: one factor per
    operation averages them; the per-kind factors land on each side of it, and the calibration's
    predictions of the plans' iteration times get closer to the 'measured' ones."""
    from pipeline.calibration.fidelity import fit_kind_scales

    profile, cluster = _measured_profile(), Cluster(devices=2)
    kinds = {x.kind for x in profile.layers}
    truth = {"F": 1.2, "I": 1.0, "W": 1.0, "W0": 1.0, "B": 1.3} | {f"B@{k}": 1.6 for k in kinds if k != "head"} | {
        "B@head": 0.5}
    plans = calibration_plans(profile, cluster, 8, count=8, seed=0)  # random splits: the kinds in varied mixes
    runs = _runs_with(truth, plans, profile, cluster)
    shared = fit_runtime_scales(plans, profile, runs)
    per_kind = fit_kind_scales(plans, profile, runs, base=shared)
    assert per_kind["B@head"] < 1.0 < 1.3 < shared["B"]  # the head's own factor, far below the shared one
    b_kinds = [k for k in per_kind if k.startswith("B@")]
    own = sum(abs(per_kind[k] - truth[k]) for k in b_kinds)
    assert own < 0.5 * sum(abs(shared["B"] - truth[k]) for k in b_kinds)  # nearer each kind's truth

    def worst(scales: dict) -> float:
        return max(abs(c.error) for c in compare_plans(plans, profile, cluster, runs=runs, scales=scales))

    assert worst(calibrate(plans, profile, cluster, runs=runs, kinds=True)) < worst(
        calibrate(plans, profile, cluster, runs=runs))


def _contended(runs: list[dict], contention: float) -> list[dict]:
    """The runs with each action as long as contention makes it: stretched by ``contention`` times
    the share of it the other device computed beside (the iteration times already carry it)."""
    out = []
    for run in runs:
        events = run["timeline"]["events"]
        stretched = []
        for e in events:
            beside = sum(max(0.0, min(e["end"], o["end"]) - max(e["start"], o["start"]))
                         for o in events if o["device"] != e["device"])
            stretched.append({**e, "end": e["end"] + contention * beside})
        out.append({**run, "timeline": {**run["timeline"], "events": stretched}})
    return out


def test_calibrate_with_contention_recovers_it_and_leaves_it_off_by_default() -> None:
    profile, cluster = _measured_profile(), Cluster(devices=2)
    calib = calibration_plans(profile, cluster, 4, count=8, seed=1)
    truth = TRUE_SCALES | {"overhead": 0.05, "transfer": 0.2, "contention": 0.3}
    runs = _contended(_runs_with(truth, calib, profile, cluster), 0.3)
    fitted = calibrate(calib, profile, cluster, runs=runs, contention=True)
    assert fitted["contention"] == pytest.approx(0.3, rel=0.05)
    assert fitted["transfer"] == pytest.approx(0.2, rel=0.1)
    assert calibrated_profile(profile, fitted).compute_contention == fitted["contention"]
    assert "contention" not in calibrate(calib, profile, cluster, runs=runs)  # off by default
    plans = named_plans(4)
    unseen = _contended(_runs_with(truth, plans, profile, cluster), 0.3)
    held_out = fidelity_summary(cross_validated(plans, profile, cluster, runs=unseen, calibration=(calib, runs),
                                                contention=True))
    assert held_out["max_abs_error_pct"] < 1.0
