"""Teach the performance model what measured replays show: runtime factors and overheads.

Used by ``python -m experiments replay`` (one plan) and by the fidelity benchmark (several):
profile the model on this device, measure the link, predict each plan with
:func:`pipeline.simulator.simulate`, run every plan in one ``torchrun`` job, and report the
relative error and whether the model orders the plans as the measurements do.

Measurements feed back: :func:`calibrate` turns replays into one factor per kind of operation
(F, I, W, the first stage's W, fused B; from the measured action timelines), a per-action
overhead and a per-transfer overhead (from the measured iteration times), which :func:`runtime_profile` applies and
:func:`calibrated_profile` bakes into a profile for search; :func:`pipeline.calibration.agreement.cross_validated`
checks them on plans they were not fitted on (random :func:`calibration_plans`, or leave one out).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pipeline.plan import Plan, parse_action
from pipeline.spec import Cluster, LayerCost, ModelProfile

__all__ = ["SCALE_KEYS", "KIND_SHRINKAGE", "MIN_STAGES_PER_LAYER", "layer_overhead_key", "fit_operation_terms",
           "measured_cluster",
           "runtime_profile", "scale_key", "layer_key", "profiled_time", "stage_durations", "fit_layer_scales",
           "fit_w_depth", "unit_plans", "shares_beside", "fit_runtime_scales", "fit_kind_scales", "overlap_shares",
           "uncontended", "fit_overheads", "fit_action_overhead", "calibrate", "calibration_plans",
           "calibrated_profile"]


#: Operation kinds the runtime scales cover: forward, input-gradient, weight-gradient, the first
#: stage's W (which runs its whole backward) and fused backward.
SCALE_KEYS = ("F", "I", "W", "W0", "B")


def runtime_profile(profile: ModelProfile, plan: Plan, scales: Mapping[str, float] | None = None) -> ModelProfile:
    """The profile as PyTorch's pipeline runtime spends it on ``plan``'s stages.

    Facts of ``_PipelineScheduleRuntime`` that per-layer ``b``/``w`` cannot express:

    * a fused ``B`` runs one autograd pass, cheaper than ``I`` then ``W`` (which walk the graph
      twice); a measured profile carries that time as ``b_full`` per layer, and the simulator
      prices B with it (:func:`pipeline.simulator.stage_costs`);
    * on the first stage ``I`` does nothing (no input gradient to send) and ``W`` runs the whole
      backward in one pass: that stage's ``b`` moves into ``w``, priced at ``b_full`` when known.

    ``scales`` (from :func:`calibrate`) multiply each kind of operation (keys :data:`SCALE_KEYS`;
    a layer kind's own, ``"B@head"``, instead of its operation's; a layer's own, ``"W#3"``
    (:func:`layer_key`), on top) and set the per-action overhead (key ``"overhead"``, the profile's
    time unit): what measured replays teach the model. Profiles without ``b_full`` (analytic ones) price B as ``b + w``.
    """
    from dataclasses import replace

    k = {key: 1.0 for key in SCALE_KEYS} | dict(scales or {})
    if "overhead" in k:
        profile = replace(profile, action_overhead=float(k["overhead"]))
    if "transfer" in k:
        profile = replace(profile, transfer_overhead=float(k["transfer"]))
    if "contention" in k:
        profile = replace(profile, compute_contention=float(k["contention"]))
    if "w_depth" in k:
        profile = replace(profile, w_depth=float(k["w_depth"]))
    add = {op: float(k.get(layer_overhead_key(op), 0.0)) for op in SCALE_KEYS}  # per layer (fit_operation_terms)
    layers = list(profile.layers)
    fused = {a.stage for acts in plan.schedule for a in acts if a.op == "B"}
    typical_b = _typical_b(k)
    for s, (start, end) in enumerate(plan.partition):
        for i in range(start, end):
            layer = layers[i]
            kk = _layer_factors(k, layer, i, typical_b)
            measured = "b_full" in layer.extra
            full = float(layer.extra["b_full"]) if measured else layer.b + layer.w
            extra = {**layer.extra, "b_full": full * kk["B"] + add["B"]} if measured else layer.extra
            f = layer.f * kk["F"] + add["F"]
            if s in fused:
                layer = (replace(layer, f=f, extra=extra) if measured
                         else replace(layer, f=f, b=layer.b * kk["B"] + add["B"], w=layer.w * kk["B"]))
            elif s == 0:
                layer = replace(layer, f=f, b=0.0, w=full * kk["W0"] + add["W0"], extra=extra)
            else:
                layer = replace(layer, f=f, b=layer.b * kk["I"] + add["I"], w=layer.w * kk["W"] + add["W"],
                                extra=extra)
            layers[i] = layer
    return replace(profile, layers=tuple(layers))


def _typical_b(k: Mapping[str, float]) -> float:
    """The median of the layers' own fused-B factors (``"B#3"``), 1 without them."""
    own_b = [v for key, v in k.items() if key.startswith("B#")]
    return statistics.median(own_b) if own_b else 1.0


def _layer_factors(k: Mapping[str, float], layer: LayerCost, index: int, typical_b: float) -> dict[str, float]:
    """Layer ``index``'s factor per operation: its kind's own (``"B@head"``), else the operation's,
    times the layer's own (:func:`fit_layer_scales`); the first stage's W is the layer's whole
    backward, so its own factor there is its fused B's over a typical layer's."""
    return {op: k.get(f"{op}@{layer.kind}", k[op]) * (k.get(layer_key(op, index), 1.0) if op != "W0"
                                                     else k.get(layer_key("B", index), typical_b) / typical_b)
            for op in SCALE_KEYS}


def scale_key(stage: int, op: str) -> str:
    """The :data:`SCALE_KEYS` key of an action: its operation, ``"W0"`` for the first stage's W."""
    return "W0" if stage == 0 and op == "W" else op


def layer_key(op: str, index: int) -> str:
    """The key of layer ``index``'s own factor on ``op`` (a :data:`SCALE_KEYS` key): ``"W#3"``."""
    return f"{op}#{index}"


def profiled_time(layers: Sequence[LayerCost], op: str) -> float:
    """What ``op`` (F, I, W or a fused B) costs over ``layers`` in their profile (B: the measured
    ``b_full`` where a layer has it, else ``b + w``), in the profile's time unit."""
    if op == "F":
        return sum(x.f for x in layers)
    if op == "I":
        return sum(x.b for x in layers)
    if op == "W":
        return sum(x.w for x in layers)
    return sum(float(x.extra.get("b_full", x.b + x.w)) for x in layers)


def shares_beside(events: Sequence[dict[str, Any]], devices: int) -> list[float]:
    """Per event of a replay's timeline, the share of its time the other devices computed too:
    their overlapping compute over its duration and the other devices' count (the ranks on one
    clock: :func:`executor.launch.rank_offsets`); 0 for an event of no duration."""
    others = max(1, devices - 1)
    out = []
    for e in events:
        dur = e["end"] - e["start"]
        together = sum(max(0.0, min(e["end"], o["end"]) - max(e["start"], o["start"]))
                       for o in events if o["device"] != e["device"])
        out.append(together / (dur * others) if dur > 0 else 0.0)
    return out


def fit_runtime_scales(named_plans: Sequence[tuple[str, Plan]], profile: ModelProfile,
                       runs: Sequence[dict[str, Any]], *, base: Mapping[str, float] | None = None) -> dict[str, float]:
    """Per kind of operation, measured time over predicted time, summed over every action of the
    replayed plans (their measured timelines): the factors :func:`runtime_profile` applies.
    Kinds the runs never executed are left out (factor 1). Measured timelines are in ms; the
    profile may use any time unit. ``base``: per-layer factors (:func:`fit_layer_scales`) the
    predictions already carry, so these factors are what is left on top of them."""
    ms_per_unit = profile.seconds_per_unit * 1e3
    measured: dict[str, float] = {}
    predicted: dict[str, float] = {}
    for (_, plan), run in zip(named_plans, runs):
        base_profile = runtime_profile(profile, plan, base)
        for (stage, op), times in stage_durations(run, ms_per_unit=ms_per_unit).items():
            key = scale_key(stage, op)
            start, end = plan.partition[stage]
            measured[key] = measured.get(key, 0.0) + sum(times)
            predicted[key] = predicted.get(key, 0.0) + profiled_time(base_profile.layers[start:end], op) * len(times)
    return {key: measured[key] / predicted[key] for key in SCALE_KEYS if predicted.get(key, 0.0) > 0}


def layer_overhead_key(op: str) -> str:
    """The key of the time each layer of a stage adds to ``op`` (a :data:`SCALE_KEYS` key): ``"W+"``."""
    return f"{op}+"


#: Replayed stages an operation needs before :func:`fit_operation_terms` fits a time per layer
#: beside its factor (two unknowns; fewer stages than this would fit their noise).
MIN_STAGES_PER_LAYER = 4


def _weighted_fit(x: np.ndarray, n: np.ndarray, y: np.ndarray, *, per_layer: bool) -> tuple[float, float, float]:
    """``y ~ a x + b n`` by least squares weighted as a ratio of sums (a stage total's variance taken as
    its size ``x``), with ``a > 0`` and ``b >= 0`` (else ``b = 0`` and ``a`` the ratio of sums); returns
    ``(a, b, weighted squared error)``. Under :data:`MIN_STAGES_PER_LAYER` rows, ``b = 0``."""
    w = 1.0 / x
    if per_layer and len(x) >= MIN_STAGES_PER_LAYER and (n > 0).any():
        lhs = np.array([[(w * x * x).sum(), (w * x * n).sum()], [(w * x * n).sum(), (w * n * n).sum()]])
        if abs(np.linalg.det(lhs)) > 1e-12 * lhs[0, 0] * lhs[1, 1]:
            a, b = np.linalg.solve(lhs, np.array([(w * x * y).sum(), (w * n * y).sum()]))
            if a > 0 and b >= 0:
                return float(a), float(b), float((w * (y - a * x - b * n) ** 2).sum())
    a = float(y.sum() / x.sum())
    return a, 0.0, float((w * (y - a * x) ** 2).sum())


def _fit_with_depth(x: np.ndarray, n: np.ndarray, m: np.ndarray, y: np.ndarray, *,
                    per_layer: bool) -> tuple[float, float, float]:
    """:func:`_weighted_fit` of ``y ~ (a x + b n)(1 + d m)`` over ``d >= 0`` as well (a grid, then a
    golden-section search around its best point); returns ``(a, b, d)``."""
    def error(d: float) -> float:
        g = 1 + d * m
        return _weighted_fit(x * g, n * g, y, per_layer=per_layer)[2]

    grid = np.linspace(0.0, 1.0, 101)
    k = int(np.argmin([error(d) for d in grid]))
    lo, hi = grid[max(k - 1, 0)], grid[min(k + 1, len(grid) - 1)]
    ratio = (np.sqrt(5) - 1) / 2
    for _ in range(60):
        d1, d2 = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        lo, hi = (lo, d2) if error(d1) <= error(d2) else (d1, hi)
    d = float((lo + hi) / 2) if error((lo + hi) / 2) < error(0.0) else 0.0
    a, b, _ = _weighted_fit(x * (1 + d * m), n * (1 + d * m), y, per_layer=per_layer)
    return a, b, d


def fit_operation_terms(named_plans: Sequence[tuple[str, Plan]], profile: ModelProfile,
                        runs: Sequence[dict[str, Any]], *, base: Mapping[str, float] | None = None,
                        per_layer: bool = True, depth: bool = True) -> dict[str, float]:
    """Per kind of operation (:data:`SCALE_KEYS`), the factor on its profiled time and, with
    ``per_layer``, a time each layer of a stage adds to it (:func:`layer_overhead_key`, the profile's
    unit); with ``depth``, W's growth with its stage's depth as well (``"w_depth"``: W costs
    ``(W + n W+) x (1 + w_depth x (n - 1))`` on a stage of ``n`` layers past the first, as the
    simulator prices it). Every replayed stage's summed measured durations of the operation against
    its layers' profiled time and count, by least squares weighted as a ratio of sums. Why per layer:
    PyTorch's runtime runs a stage's backward through autograd with per-module work that does not
    scale with the layer's FLOPs; on two CPU ranks each layer of a stage added 0.3-0.6 ms to I and W
    and about 1 ms to a fused B, which a factor alone spreads over the layers by their size (a head
    at 1.05x its W profile beside blocks at 1.35x). Without such data a term is 0 (``b``) or the
    plain ratio of sums (the factor). ``base``: per-layer factors the profile carries."""
    ms_per_unit = profile.seconds_per_unit * 1e3
    rows: dict[str, list[tuple[float, float, float, float]]] = {}  # key -> (profiled, layers, past first, measured)
    for (_, plan), run in zip(named_plans, runs):
        priced = runtime_profile(profile, plan, base)
        for (stage, op), times in stage_durations(run, ms_per_unit=ms_per_unit).items():
            start, end = plan.partition[stage]
            profiled = profiled_time(priced.layers[start:end], op) * len(times)
            if profiled > 0:
                key = scale_key(stage, op)
                rows.setdefault(key, []).append((profiled, (end - start) * len(times),
                                                 end - start - 1 if key == "W" else 0, sum(times)))
    out: dict[str, float] = {}
    for key in SCALE_KEYS:
        if key not in rows:
            continue
        x, n, m, y = (np.array(col, dtype=float) for col in zip(*rows[key]))
        if key == "W" and depth:
            a, b, out["w_depth"] = _fit_with_depth(x, n, m, y, per_layer=per_layer)
        else:
            a, b, _ = _weighted_fit(x, n, y, per_layer=per_layer)
        out[key] = a
        if per_layer:
            out[layer_overhead_key(key)] = b
    return out


def fit_w_depth(named_plans: Sequence[tuple[str, Plan]], profile: ModelProfile, runs: Sequence[dict[str, Any]], *,
                base: Mapping[str, float] | None = None) -> dict[str, float]:
    """The W factor and the profile's ``w_depth`` together (keys ``"W"``, ``"w_depth"``): each
    replayed stage's measured W time (not the first stage's) against ``W x (1 + w_depth x (n - 1))``
    its ``n`` layers' profiled W (:func:`fit_operation_terms` without per-layer times). Without
    stages of more than one layer, or where deeper stages would come out cheaper, ``w_depth`` is 0
    and W the plain ratio of sums."""
    fitted = fit_operation_terms(named_plans, profile, runs, base=base, per_layer=False)
    return {key: fitted[key] for key in ("W", "w_depth") if key in fitted}


def stage_durations(run: Mapping[str, Any], *, ms_per_unit: float = 1.0) -> dict[tuple[int, str], list[float]]:
    """Per stage and operation of a replay's measured timeline, every action's duration (in the
    profile's unit: ``ms_per_unit`` ms each)."""
    out: dict[tuple[int, str], list[float]] = {}
    for event in run["timeline"]["events"]:
        stage, op, _ = parse_action(event["action"])
        out.setdefault((stage, op), []).append((event["end"] - event["start"]) / ms_per_unit)
    return out


def fit_layer_scales(named_plans: Sequence[tuple[str, Plan]], profile: ModelProfile,
                     runs: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Per layer and operation F, I, W, B (keys :func:`layer_key`, ``"W#3"``; a first stage's W,
    the whole backward of its layers, takes their B factors), the median over the replayed plans
    of what that layer alone took in the pipeline (the median duration of the operation on a stage
    of that one layer) over its per-layer profile. Only stages of one layer inform it, and not the
    first stage (no input gradient, nothing received: its one layer, the embedding, costs little
    beside the runtime's work around it, and its factors made the fit worse); :func:`unit_plans`
    replays every other layer so. The profile times each
    layer once per pass, after its neighbour in the model: on two CPU ranks two identical blocks came
    out 0.64 and 0.82 ms by their place in that pass (0.48-0.50 ms each when repeated alone), and
    the head's fused backward 40% above what the pipeline spends. A stage's time is the sum of its
    layers' own in the pipeline far more closely than of their profiled times (the spread of the
    one over the other, over the multi-layer stages of four replay sets: F 0.08 against 0.12, I 0.10
    against 0.13, W 0.09 against 0.16, fused B 0.07 against 0.21, in log)."""
    ms_per_unit = profile.seconds_per_unit * 1e3
    ratios: dict[str, list[float]] = {}
    for (_, plan), run in zip(named_plans, runs):
        raw = runtime_profile(profile, plan)
        for (stage, op), times in stage_durations(run, ms_per_unit=ms_per_unit).items():
            start, end = plan.partition[stage]
            profiled = profiled_time(raw.layers[start:end], op)
            if end - start == 1 and profiled > 0 and stage != 0:
                key = layer_key(scale_key(stage, op), start)
                ratios.setdefault(key, []).append(statistics.median(times) / profiled)
    return {key: float(np.clip(statistics.median(v), 0.2, 5.0)) for key, v in sorted(ratios.items())}


def unit_plans(profile: ModelProfile, cluster: Cluster, microbatches: int) -> list[tuple[str, Plan]]:
    """Two plans that time every layer alone in the pipeline, for :func:`fit_layer_scales`: one stage
    per layer, stage ``s`` on device ``s mod devices``, list-scheduled with a split backward
    (``"unit-split"``: F, I and W of each layer) and a fused one (``"unit-fused"``: its B)."""
    from pipeline.candidates import Candidate, Scenario, materialize

    P, L = cluster.devices, profile.num_layers
    scenario = Scenario(profile, cluster, microbatches)
    out = []
    for name, split in (("unit-split", True), ("unit-fused", False)):
        cand = Candidate((1,) * L, tuple(s % P for s in range(L)), "list", None, split_backward=split)
        plan = materialize(cand, scenario)
        out.append((name, Plan(plan.devices, plan.microbatches, plan.partition, plan.placement, plan.schedule,
                               {"method": name})))
    return out


#: Shrinkage of a layer kind's own factor toward its operation's (ridge weight, relative to the
#: kind's own data): a kind seen in few stages keeps close to the shared factor.
KIND_SHRINKAGE = 0.25


def fit_kind_scales(named_plans: Sequence[tuple[str, Plan]], profile: ModelProfile, runs: Sequence[dict[str, Any]],
                    *, base: Mapping[str, float]) -> dict[str, float]:
    """Per operation and layer kind (keys ``"B@head"``), the factor on that kind's profiled time that
    best explains every replayed stage's median measured duration of that operation (a stage sums
    its layers of each kind), shrunk toward the operation's shared factor in ``base``
    (:data:`KIND_SHRINKAGE`) and kept within 0.2-5. One factor per kind, never per plan or stage:
    the replays showed a head's fused backward at about half its per-layer profile and a stage of
    blocks at 1.5-2x, which one shared factor per operation averages away."""
    import statistics

    ms_per_unit = profile.seconds_per_unit * 1e3
    kinds = sorted({x.kind for x in profile.layers})
    rows: dict[str, list[tuple[dict[str, float], float]]] = {}
    for (_, plan), run in zip(named_plans, runs):
        raw = runtime_profile(profile, plan)
        for (stage, op), times in stage_durations(run, ms_per_unit=ms_per_unit).items():
            start, end = plan.partition[stage]
            per_kind: dict[str, float] = {}
            for x in raw.layers[start:end]:
                per_kind[x.kind] = per_kind.get(x.kind, 0.0) + profiled_time((x,), op)
            key = scale_key(stage, op)
            if sum(per_kind.values()) > 0:  # what the per-layer times (fit_operation_terms) leave to the factors
                added = float(base.get(layer_overhead_key(key), 0.0)) * (end - start)
                rows.setdefault(key, []).append((per_kind, statistics.median(times) - added))
    out: dict[str, float] = {}
    for key, data in rows.items():
        seen = [kd for kd in kinds if any(pk.get(kd, 0.0) > 0 for pk, _ in data)]
        if len(seen) < 2 or key not in base:
            continue  # one kind: the shared factor already is its own
        X = np.array([[pk.get(kd, 0.0) for kd in seen] for pk, _ in data])
        y = np.array([t for _, t in data])
        prior = np.full(len(seen), float(base[key]))
        D = np.diag(KIND_SHRINKAGE * (X ** 2).sum(axis=0))
        a = np.linalg.solve(X.T @ X + D, X.T @ y + D @ prior)
        for kd, v in zip(seen, np.clip(a, 0.2, 5.0)):
            out[f"{key}@{kd}"] = float(v)
    return out


def overlap_shares(named_plans: Sequence[tuple[str, Plan]], runs: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Per kind of operation (keys :data:`SCALE_KEYS`), the share of its measured time during which
    the other devices computed too (their overlapping compute over its duration and the other
    devices' count, summed over every action of the replays; the ranks on one clock,
    :func:`executor.launch.rank_offsets`): how much contention the per-operation factors of those replays average in."""
    together: dict[str, float] = {}
    total: dict[str, float] = {}
    for (_, plan), run in zip(named_plans, runs):
        events = run["timeline"]["events"]
        for e, share in zip(events, shares_beside(events, plan.devices)):
            stage, op, _ = parse_action(e["action"])
            key = scale_key(stage, op)
            together[key] = together.get(key, 0.0) + share * (e["end"] - e["start"])
            total[key] = total.get(key, 0.0) + e["end"] - e["start"]
    return {key: together[key] / total[key] for key in total if total[key] > 0}


def uncontended(scales: Mapping[str, float], shares: Mapping[str, float], contention: float) -> dict[str, float]:
    """``scales`` with each operation's factor (and its layer kinds', ``"B@head"``) divided by
    ``1 + contention x`` its :func:`overlap_shares` share: the factors of an action no other device
    computes beside, which the simulator's contention term then stretches where devices compute at
    once (:func:`pipeline.event_sim.iteration_time`)."""
    out = dict(scales)
    for key, v in scales.items():
        op = key.split("@")[0].removesuffix("+")  # a factor, or a per-layer time (fit_operation_terms)
        if op in SCALE_KEYS:
            out[key] = v / (1 + contention * shares.get(op, 0.0))
    return out


def fit_overheads(named_plans: Sequence[tuple[str, Plan]], profile: ModelProfile, cluster: Cluster, *,
                  runs: Sequence[dict[str, Any]], scales: Mapping[str, float] | None = None,
                  transfers: bool = True, contention: bool = False) -> dict[str, float]:
    """The per-action overhead (``"overhead"``) and the per-transfer-end overhead (``"transfer"``,
    :attr:`pipeline.spec.ModelProfile.transfer_overhead`), profile time unit, that make the simulated
    iteration times of the replayed plans closest to the measured ones (least squared relative
    error), by Gauss-Newton steps from zero (the simulated time is piecewise linear in both).
    Measured action timelines cover compute only, so what the runtime spends between actions and on transfers
    shows up here. ``transfers=False`` fits the per-action overhead alone. ``contention`` fits the
    compute contention between devices as well (``"contention"``,
    :attr:`pipeline.spec.ModelProfile.compute_contention`), with ``scales`` taken as the replays'
    average factors and made :func:`uncontended` for each value tried; the caller applies the
    same to ``scales`` with the fitted value (:func:`calibrate` does)."""
    from pipeline.simulator import simulate

    ms_per_unit = profile.seconds_per_unit * 1e3
    targets = [(plan, run["measured_iteration_time"] / ms_per_unit) for (_, plan), run in zip(named_plans, runs)]
    if not targets:
        return {"overhead": 0.0} | ({"transfer": 0.0} if transfers else {})
    base = {key: v for key, v in (scales or {}).items() if key not in ("overhead", "transfer", "contention")}

    measured = np.array([m for _, m in targets])
    shares = overlap_shares(named_plans, runs) if contention else {}

    def predict(values: dict[str, float]) -> np.ndarray:
        factors = uncontended(base, shares, values["contention"]) if contention else base
        return np.array([simulate(plan, runtime_profile(profile, plan, factors | values), cluster, validate=False,
                                  record_timeline=False).iteration_time for plan, _ in targets])

    keys = (["overhead", "transfer"] if transfers else ["overhead"]) + (["contention"] if contention else [])
    x = np.zeros(len(keys))
    h = np.array([1e-3 if key == "contention" else 1e-3 * float(measured.min()) for key in keys])  # unitless / time
    for _ in range(8):  # Gauss-Newton on the relative errors: times are piecewise linear in the overheads
        now = predict(dict(zip(keys, x)))
        jac = np.stack([(predict(dict(zip(keys, x + h[k] * np.eye(len(keys))[k]))) - now) / h[k]
                        for k in range(len(keys))], axis=1) / measured[:, None]
        step, *_ = np.linalg.lstsq(jac, (measured - now) / measured, rcond=None)
        new = np.maximum(0.0, x + step)
        if np.allclose(new, x, rtol=1e-9, atol=1e-12):
            break
        x = new
    return {key: float(v) for key, v in zip(keys, x)}


def fit_action_overhead(named_plans: Sequence[tuple[str, Plan]], profile: ModelProfile, cluster: Cluster, *,
                        runs: Sequence[dict[str, Any]], scales: Mapping[str, float] | None = None) -> float:
    """The per-action overhead alone (:func:`fit_overheads` without the per-transfer term)."""
    return fit_overheads(named_plans, profile, cluster, runs=runs, scales=scales, transfers=False)["overhead"]


def calibrate(named_plans: Sequence[tuple[str, Plan]], profile: ModelProfile, cluster: Cluster, *,
              runs: Sequence[dict[str, Any]], kinds: bool = False, contention: bool = False,
              layers: bool = False, depth: bool = True, layer_times: bool = True) -> dict[str, float]:
    """Everything replays teach the model: :func:`fit_runtime_scales` plus ``"overhead"`` and
    ``"transfer"`` from :func:`fit_overheads`. One replayed plan cannot tell the two overheads
    apart (one equation, two unknowns): then ``"transfer"`` is 0 and the per-action overhead takes
    all the time between actions, as before the per-transfer term existed. ``contention``: the
    compute contention between devices too (``"contention"``, fitted with the overheads; the
    per-operation factors then are :func:`uncontended`). ``layers``: each layer's own factor first
    (:func:`fit_layer_scales`, from the stages of one layer; :func:`unit_plans` gives every layer
    one), the per-operation factors then fitted on top of them. ``depth`` (default): the W factor
    together with the profile's ``w_depth``, how much a stage's W grows per layer (:func:`fit_w_depth`).
    ``layer_times`` (default): each operation's factor together with a time every layer of a stage
    adds to it (keys ``"W+"``, :func:`fit_operation_terms`)."""
    own = fit_layer_scales(named_plans, profile, runs) if layers else {}
    if depth or layer_times:  # per-layer times, and W with the depth of its stage
        scales = fit_operation_terms(named_plans, profile, runs, base=own, per_layer=layer_times, depth=depth) | own
    else:
        scales = fit_runtime_scales(named_plans, profile, runs, base=own) | own
    if kinds:  # and per layer kind (:func:`fit_kind_scales`; off by default: see docs/fidelity.md)
        scales |= fit_kind_scales(named_plans, profile, runs, base=scales)
    both = len(named_plans) >= 2
    fitted = fit_overheads(named_plans, profile, cluster, runs=runs, scales=scales, transfers=both,
                           contention=contention and len(named_plans) >= 3)
    if "contention" in fitted:
        scales = uncontended(scales, overlap_shares(named_plans, runs), fitted["contention"])
    return scales | {"transfer": 0.0} | fitted


def calibration_plans(profile: ModelProfile, cluster: Cluster, microbatches: int, *, count: int,
                      seed: int = 0, units: bool = False) -> list[tuple[str, Plan]]:
    """``count`` random plans to replay for calibration: random partitions into 2-6 stages,
    random stage-to-device maps that use every device, list-scheduled with fused or split
    backward and deferred or eager W. Deterministic for ``seed``. ``units``: the two
    :func:`unit_plans` first (every layer timed alone, for ``calibrate(..., layers=True)``)."""
    import random

    from pipeline.candidates import Candidate, Scenario, materialize

    rng = random.Random(seed)
    P, L = cluster.devices, profile.num_layers
    scenario = Scenario(profile, cluster, microbatches)
    out: list[tuple[str, Plan]] = []
    for _ in range(100 * max(1, count)):
        if len(out) >= count:
            break
        stages = rng.randint(max(2, P), min(L, max(6, P)))
        if stages > L:
            break
        cuts = sorted(rng.sample(range(1, L), stages - 1))
        bounds = [0, *cuts, L]
        sizes = tuple(bounds[i + 1] - bounds[i] for i in range(stages))
        placement = tuple(rng.randrange(P) for _ in range(stages))
        if len(set(placement)) < P:
            continue
        cand = Candidate(sizes, placement, "list", None, split_backward=rng.random() < 0.6,
                         eager_w=rng.random() < 0.3)
        plan = materialize(cand, scenario)
        name = f"calib{len(out)}"
        out.append((name, Plan(plan.devices, plan.microbatches, plan.partition, plan.placement, plan.schedule,
                               {"method": name})))
    return (unit_plans(profile, cluster, microbatches) if units else []) + out


def calibrated_profile(profile: ModelProfile, scales: Mapping[str, float]) -> ModelProfile:
    """``profile`` with ``f``, ``b``, ``w`` (and ``b_full``) multiplied by the F, I, W (and B)
    scales, plus each operation's per-layer time, and the per-action overhead set (key
    ``"overhead"``), for searches that should price plans as replays measured them; with a fitted
    ``"W0"``, each layer's ``extra["b_first"]``: its whole backward as the first stage's W (which
    :func:`pipeline.simulator.stage_costs` then prices as :func:`runtime_profile` does). The scales
    are kept in ``extra["runtime_scales"]``."""
    from dataclasses import replace

    k = {key: 1.0 for key in SCALE_KEYS} | dict(scales)
    add = {op: float(k.get(layer_overhead_key(op), 0.0)) for op in SCALE_KEYS}
    typical_b = _typical_b(k)
    layers = []
    for i, layer in enumerate(profile.layers):
        kk = _layer_factors(k, layer, i, typical_b)
        extra = dict(layer.extra)
        full = float(extra.get("b_full", layer.b + layer.w))
        if "W0" in scales:  # the first stage's whole backward, run as its W (runtime_profile; stage_costs)
            extra["b_first"] = full * kk["W0"] + add["W0"]
        if "b_full" in extra:
            extra["b_full"] = float(extra["b_full"]) * kk["B"] + add["B"]
        layers.append(replace(layer, f=layer.f * kk["F"] + add["F"], b=layer.b * kk["I"] + add["I"],
                              w=layer.w * kk["W"] + add["W"], extra=extra))
    return replace(profile, layers=tuple(layers), action_overhead=float(k.get("overhead", profile.action_overhead)),
                   transfer_overhead=float(k.get("transfer", profile.transfer_overhead)),
                   compute_contention=float(k.get("contention", profile.compute_contention)),
                   w_depth=float(k.get("w_depth", profile.w_depth)),
                   extra={**profile.extra, "runtime_scales": {key: round(v, 6) for key, v in k.items()}})


def measured_cluster(devices: int, bench: dict[str, Any], *, memory_gb: float = 64.0,
                     memory_reserve_gb: float | None = None, name: str = "local") -> Cluster:
    """A cluster JSON from :func:`executor.replay.p2p_bench`'s latency and bandwidth.

    ``memory_reserve_gb`` (GiB) defaults to :data:`pipeline.spec.DEFAULT_MEMORY_RESERVE_GB` when the
    link was measured with NCCL (GPUs: CUDA context, NCCL buffers) and to 0 with gloo (CPU ranks)."""
    from pipeline.spec import DEFAULT_MEMORY_RESERVE_GB

    if memory_reserve_gb is None:
        memory_reserve_gb = DEFAULT_MEMORY_RESERVE_GB if bench.get("backend") == "nccl" else 0.0
    return Cluster(devices=devices, memory_gb=memory_gb, p2p_gbps=max(bench["p2p_gbps"], 1e-6),
                   latency_us=bench["latency_us"], name=name, memory_reserve_gb=memory_reserve_gb,
                   extra={"measured": True, "backend": bench.get("backend", "gloo")})
