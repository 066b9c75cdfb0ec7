"""env.editor: the action table, edits that keep plans valid, keep-or-roll-back, masks, and shared caches."""

from __future__ import annotations

import numpy as np
import pytest

from env.editor import (
    ACTIONS,
    BUDGET_DOWN,
    BUDGET_UP,
    GLOBAL_ACTIONS,
    GROW_LEFT,
    GROW_RIGHT,
    MAX_DEVICES,
    MAX_STAGES,
    N_ACTIONS,
    PLACEMENT_FAMILIES,
    Edit,
    PlanEditor,
    SharedEvaluator,
    family_of,
    fit_memory,
    portfolio,
    score,
)
from pipeline.candidates import Candidate, Scenario, objective_key
from pipeline.errors import PlanError
from pipeline.evaluator import Evaluator
from pipeline.plan import validate_plan
from pipeline.simulator import simulate
from pipeline.spec import Cluster, ModelProfile
from tests.conftest import ROOT, ideal_cluster, uniform_profile

PROFILE = ModelProfile.load(ROOT / "experiments/configs/profiles/hetero-head-16.json")
CLUSTER = Cluster.load(ROOT / "experiments/configs/clusters/h100x4.json")
SCENARIO = Scenario(PROFILE, CLUSTER, 8)


def _editor(scenario: Scenario = SCENARIO, **kw) -> PlanEditor:
    editor = PlanEditor(scenario, **kw)
    editor.start()
    return editor


def _check_candidate(c: Candidate, scenario: Scenario) -> None:
    assert sum(c.sizes) == scenario.profile.num_layers and min(c.sizes) >= 1
    assert len(c.placement) == c.num_stages and set(c.placement) <= set(range(scenario.devices))
    if c.budgets is not None:
        assert len(c.budgets) == scenario.devices
        assert all(1.0 <= b <= max(scenario.microbatches, 1) for b in c.budgets)


def test_the_action_table_has_one_entry_per_edit() -> None:
    assert len(ACTIONS) == N_ACTIONS and ACTIONS[0] == Edit("stop")
    for i in range(MAX_STAGES - 1):
        assert ACTIONS[GROW_LEFT + i] == Edit("grow-left", i) and ACTIONS[GROW_RIGHT + i] == Edit("grow-right", i)
    for d in range(MAX_DEVICES):
        assert ACTIONS[BUDGET_UP + d] == Edit("budget-up", d) and ACTIONS[BUDGET_DOWN + d] == Edit("budget-down", d)
    per_item = set(range(GROW_LEFT, GROW_RIGHT + MAX_STAGES - 1)) | set(range(BUDGET_UP, BUDGET_DOWN + MAX_DEVICES))
    assert set(GLOBAL_ACTIONS).isdisjoint(per_item) and set(GLOBAL_ACTIONS) | per_item == set(range(N_ACTIONS))
    assert len(set(ACTIONS)) == N_ACTIONS
    assert str(Edit("stop")) == "stop" and str(Edit("family", 2)) == "family(2)"
    assert sum(e.kind == "family" for e in ACTIONS) == len(PLACEMENT_FAMILIES)


def test_start_takes_the_best_starting_plan() -> None:
    editor = _editor()
    starts = portfolio(SCENARIO)
    assert editor.ev.calls >= len(starts)
    assert all(editor.key <= objective_key(editor.ev.result(c)) for c in starts)
    assert editor.best == editor.current and editor.best_result is editor.result
    assert editor.plan.num_layers == PROFILE.num_layers and editor.best_plan == editor.plan
    for c in starts:
        kind, chunks = PLACEMENT_FAMILIES[family_of(c, SCENARIO.devices)]
        assert len(c.placement) == chunks * SCENARIO.devices
    with pytest.raises(PlanError, match="no starting candidate"):
        PlanEditor(SCENARIO).start([])


def test_every_allowed_edit_leads_to_a_valid_new_plan() -> None:
    editor = _editor()
    mask = editor.mask()
    assert mask.dtype == bool and mask.shape == (N_ACTIONS,) and mask[0] and mask[1:].any()
    fresh = Evaluator(SCENARIO)
    targets = editor.targets()
    for a in np.flatnonzero(mask[1:]) + 1:
        t = targets[a]
        assert t is not None and t != editor.current and not editor.ev.known(t)
        _check_candidate(t, SCENARIO)
        plan = fresh.plan(t)
        validate_plan(plan, num_layers=PROFILE.num_layers, devices=SCENARIO.devices)
        assert simulate(plan, PROFILE, CLUSTER).valid
    for a in np.flatnonzero(~mask):
        assert targets[a] is None
    # what each kind of edit changes
    c = editor.current
    for a in np.flatnonzero(mask[1:]) + 1:
        e, t = ACTIONS[a], targets[a]
        if e.kind in ("grow-left", "grow-right"):
            i = int(e.arg)
            grown = i if e.kind == "grow-left" else i + 1
            assert t.sizes[grown] == c.sizes[grown] + 1 and sum(t.sizes) == sum(c.sizes)
            assert t.placement == c.placement
        elif e.kind == "budget-up":
            d = int(e.arg)
            assert t.budgets[d] > c.budgets[d] and t.budgets[:d] == c.budgets[:d]
        elif e.kind == "toggle":
            assert getattr(t, str(e.arg)) is not getattr(c, str(e.arg))


def test_an_edit_is_kept_only_when_it_is_better() -> None:
    editor = _editor()
    start_key = editor.key
    steps = 0
    while steps < 60:
        mask = editor.mask()
        allowed = np.flatnonzero(mask[1:]) + 1
        if not allowed.size:
            break
        a = int(allowed[steps % allowed.size])
        before, key, calls = editor.current, editor.key, editor.ev.calls
        target = editor.targets()[a]
        kept, res = editor.apply(a)
        assert editor.ev.calls == calls + 1  # one simulator call per edit
        assert kept == (objective_key(res) < key)
        if kept:
            assert editor.current == target and editor.key == objective_key(res)
        else:  # rolled back, and masked (with every action that leads to the same plan)
            assert editor.current == before and editor.key == key
            assert not editor.mask()[a]
            assert all(t != target for t in editor.targets() if t is not None)
        assert objective_key(editor.best_result) <= editor.key
        steps += 1
    assert steps > 10 and editor.key <= start_key
    assert editor.apply(0) == (False, None)  # stop: nothing evaluated


def test_the_call_budget_leaves_only_stop() -> None:
    editor = _editor(max_calls=12)
    while editor.budget_left():
        allowed = np.flatnonzero(editor.mask()[1:]) + 1
        editor.apply(int(allowed[0]))
    assert editor.ev.calls == 12
    mask = editor.mask()
    assert mask[0] and not mask[1:].any()


def test_fit_memory_cuts_budgets_to_what_memory_holds() -> None:
    profile = uniform_profile(8, act=2**30, params=10**6)  # 1 GiB of activations per layer and micro-batch
    scenario = Scenario(profile, ideal_cluster(4, memory_gb=6.0), 16)
    ev = Evaluator(scenario)
    c = Candidate((2, 2, 2, 2), (0, 1, 2, 3), "list", (16.0,) * 4)
    res = ev.result(c)
    assert res.valid and not res.feasible
    fixed = fit_memory(c, res, ev)
    assert fixed is not None and fixed.cap_counts_w
    assert all(1.0 <= b <= 16.0 for b in fixed.budgets) and max(fixed.budgets) < 16.0
    after = ev.result(fixed)
    assert after.feasible and objective_key(after) < objective_key(res)
    assert fit_memory(fixed, after, ev) is None  # fits already
    assert fit_memory(Candidate((2, 2, 2, 2), (0, 1, 2, 3), "1f1b"), res, ev) is None  # not a list order


def test_score_ranks_fast_over_slow_over_overflowing_over_invalid() -> None:
    editor = _editor()
    res = editor.result
    assert score(res, res.iteration_time) == pytest.approx(1.0)
    assert score(res, 2 * res.iteration_time) == pytest.approx(2.0)
    tight = Scenario(uniform_profile(8, act=2**30), ideal_cluster(4, memory_gb=2.0), 16)
    over = Evaluator(tight).result(Candidate((2, 2, 2, 2), (0, 1, 2, 3), "list", (16.0,) * 4))
    assert -2.0 <= score(over, 1.0) < -1.0
    bad = Evaluator(SCENARIO).result(Candidate((15, 1), (0, 1), "zbv"))  # ZB-V needs a V placement
    assert not bad.valid and score(bad, 1.0) == -3.0


def test_shared_evaluator_shares_the_scenarios_caches_and_still_counts_calls() -> None:
    first = SharedEvaluator(SCENARIO)
    c = portfolio(SCENARIO)[0]
    r = first.result(c)
    second = SharedEvaluator(SCENARIO, share=first)
    assert not second.known(c) and second.calls == 0
    assert second.result(c) is r and second.calls == 1 and second.known(c)  # from the memo, counted
    assert second.result(c) is r and second.calls == 1  # then this episode's own cache: free
    assert second.costs(c.sizes, c.placement) is first.costs(c.sizes, c.placement)
    assert second.balanced_sizes(c.placement) is first.balanced_sizes(c.placement)
    own = SharedEvaluator(SCENARIO, share=first, results=False)  # splits and costs shared, results not
    assert own.costs(c.sizes, c.placement) is first.costs(c.sizes, c.placement)
    again = own.result(c)
    assert again is not r and again.iteration_time == r.iteration_time and own.calls == 1
    other = SharedEvaluator(Scenario(PROFILE, CLUSTER, 8), share=first)  # an equal scenario, not the same object
    assert other.costs(c.sizes, c.placement) is not first.costs(c.sizes, c.placement)
    assert other.result(c) is not r


def test_the_memo_is_bounded(monkeypatch) -> None:
    monkeypatch.setattr(SharedEvaluator, "MEMO_LIMIT", 2)
    ev = SharedEvaluator(SCENARIO)
    starts = portfolio(SCENARIO)[:3]
    for c in starts:
        ev.result(c)
    later = SharedEvaluator(SCENARIO, share=ev)
    later.result(starts[0])
    assert later.result(starts[0]) is not ev.cached(starts[0])  # cleared when full: simulated again


def test_an_editor_decides_the_same_with_a_shared_evaluator() -> None:
    """Episodes that share a memo spend the calls and reach the plans a fresh evaluator would."""
    def episode(evaluator: Evaluator) -> tuple:
        editor = _editor(evaluator=evaluator)
        path = []
        for step in range(25):
            allowed = np.flatnonzero(editor.mask()[1:]) + 1
            if not allowed.size:
                break
            a = int(allowed[(7 * step) % allowed.size])
            path.append((a, editor.apply(a)[0]))
        return path, editor.best, editor.ev.calls

    fresh = episode(Evaluator(SCENARIO))
    warm = SharedEvaluator(SCENARIO)
    assert episode(warm) == fresh
    assert episode(SharedEvaluator(SCENARIO, share=warm)) == fresh


def test_too_many_devices_is_refused() -> None:
    with pytest.raises(PlanError, match=f"at most {MAX_DEVICES} devices"):
        PlanEditor(Scenario(uniform_profile(64), ideal_cluster(MAX_DEVICES + 1), 64))


def test_the_fast_copies_do_not_carry_the_hash() -> None:
    """``_with`` copies a candidate's fields without its constructor; the kept hash of the
    original (``Candidate.__hash__``) must not come along with the changed fields."""
    from env.editor import _with

    c = Candidate((2, 3), (0, 1), budgets=(1.0, 2.0))
    hash(c)
    moved = _with(c, sizes=(3, 2))
    assert hash(moved) == hash(Candidate((3, 2), (0, 1), budgets=(1.0, 2.0))) != hash(c)
    assert moved in {Candidate((3, 2), (0, 1), budgets=(1.0, 2.0))}


def test_portfolio_is_its_picks_under_preset_candidate() -> None:
    """portfolio's copies of its cached picks are the candidates preset_candidate makes of each pick that
    fits, in order, with the DP-balanced split (one and many devices, few and many layers)."""
    from pipeline.candidates import make_placement
    from pipeline.start_recipes import preset_candidate

    picks = (("sequential", 1, "zb-h2"), ("v", 2, "zbv"), ("interleaved", 2, "zb-h2"), ("sequential", 1, "zb-h1"),
             ("v", 2, "v-half"), ("interleaved", 3, "zb-h1"), ("wave", 3, "zbv"), ("interleaved", 2, "zb-h1"),
             ("interleaved", 4, "zb-h1"), ("sequential", 1, "unlimited"))
    for devices, blocks in ((1, 4), (2, 3), (4, 6), (4, 14), (8, 30)):
        scenario = Scenario(uniform_profile(blocks), ideal_cluster(devices), 8)
        ev = Evaluator(scenario)
        L = scenario.profile.num_layers
        expected = [preset_candidate(ev.balanced_sizes(make_placement(kind, devices, chunks)),
                                     make_placement(kind, devices, chunks), preset, devices=devices)
                    for kind, chunks, preset in picks
                    if devices * chunks <= min(L, MAX_STAGES) and (chunks == 1 or devices >= 2)]
        for _ in range(2):  # (the second from the cache)
            got = portfolio(scenario)
            assert got == expected and [hash(c) for c in got] == [hash(c) for c in expected]
