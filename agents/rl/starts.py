"""A learned start ranker: which starting plans to simulate first, chosen from the scenario alone.

Every search starts from a handful of recipes (the tuner simulates ~100 of them before it edits
anything). Which one wins depends on the scenario: V-shapes where the head dominates, deep
interleaving with many micro-batches, memory-cut budgets where memory binds, a hand-built
V-Half where memory is tight and micro-batches many. The ranker learns that map: a contextual
bandit over a fixed list of recipes (:data:`ARMS`), trained with full information (every
recipe simulated on each training scenario, one batched native call) by a listwise
cross-entropy against ``softmax(log(best / time) / temperature)``. It reads 16 numbers that
need no simulation (:func:`scenario_features`) and scores every recipe; searchers simulate the
top ones (:func:`ranked_starts`).

Recipes (:data:`ARMS`, stable names): each placement family of the tuner's seeds
(:data:`pipeline.start_recipes.PLACEMENT_CHOICES`) at the DP-balanced, Megatron and device-balanced
(``devbal``, :mod:`pipeline.balance`) splits under each schedule's activation budget, the same
with budgets cut to the memory left after the static share (``:fit``), budgets that fill each
device's memory (``:filled``, :meth:`pipeline.evaluator.Evaluator.memory_budgets`), deeper budgets
sized by the activations alone (``:roomy``, :func:`pipeline.budgets.roomy_budgets`; may overflow,
the simulator decides), the same with at most two ``W`` pending per device (``:roomy:w2``: few
kept shares at once, as those budgets assume; fits far more often) and with device 0's stages
recomputing (``:rc0``: the device whose first stage holds its activations longest, lightened so
the others' warm-up fits), every stage
recomputing under cut budgets (``:recompute``, where nothing else fits), the fixed orders
(1F1B, interleaved) and the named hand-built schedules (``named:*``, e.g. V-Half; simulated as
plans, not editable). On devices of mixed speeds :func:`ranked_starts` follows each list recipe
it picks with its ``:slow-first`` twin (devices ordered slowest first, fastest last,
:func:`pipeline.candidates.slow_first`: the head's stage on the fastest device), not a learned arm.
The ranker is saved as a torch state dict (``.pt``, loaded with ``weights_only=True``) with a
``.json`` of its metadata.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agents.listwise import listwise_targets
from pipeline.budgets import cut_budgets
from pipeline.candidates import Candidate, Scenario, make_placement, slow_first
from pipeline.errors import ConfigError, PlanError
from pipeline.evaluator import Evaluator
from pipeline.start_recipes import (
    PLACEMENT_CHOICES,
    SEED_PRESETS,
    SPLITS,
    fit_candidate,
    fixed_order_candidate,
    named_schedule_plan,
    preset_candidate,
    recompute_candidate,
    split_sizes,
    with_filled_budgets,
    with_roomy_budgets,
)

__all__ = ["ARMS", "FEATURES", "DEFAULT_RANKER", "Arm", "scenario_features", "arm_candidates", "StartRanker",
           "collect_arm_labels", "fit_ranker", "save_ranker", "load_ranker", "ranked_starts", "fits_by_construction",
           "SLOW_FIRST", "build_arm", "holds_one_microbatch"]

_NAMED = ("zbv", "v-half", "v-min", "dualpipev", "zb-h1", "zb-h2", "i1f1b-v2", "1f1b", "megatron")


def _arm_names() -> tuple[str, ...]:
    names = []
    for kind, chunks in PLACEMENT_CHOICES:
        for split in SPLITS:
            for b in SEED_PRESETS:
                names.append(f"list:{kind}{chunks}:{split}:{b or 'unlimited'}")
                if b is not None:
                    names.append(f"list:{kind}{chunks}:{split}:{b}:fit")
            names.append(f"list:{kind}{chunks}:{split}:filled")
            names += [f"list:{kind}{chunks}:{split}:roomy{w}{rc}" for w in ("", ":w2") for rc in ("", ":rc0")]
            if (kind == "interleaved" or chunks == 1) and split != "devbal":
                names.append(f"fixed:{kind}{chunks}:{split}")
        names.append(f"list:{kind}{chunks}:dp:recompute")
    names += [f"named:{m}:{split}" for m in _NAMED for split in ("dp", "megatron") if not (m == "megatron" and
                                                                                          split == "dp")]
    return tuple(names)


#: The recipes, by stable name (the ranker's outputs, in this order).
ARMS: tuple[str, ...] = _arm_names()
#: The scenario features the ranker reads (:func:`scenario_features`).
FEATURES: tuple[str, ...] = (
    "log2(devices)/5", "log2(microbatches)/8", "log2(layers)/8", "log2(microbatches/devices)/4",
    "head/stage", "embedding/stage", "max_layer/stage", "cost_cv", "comm/stage", "static/limit",
    "log2(mbs_fit/devices)/4", "multi_node", "speed_spread", "moe_share", "mixer_share", "layers/devices/8",
)
#: Suffix of a list recipe's twin with the devices in :func:`pipeline.candidates.slow_first` order
#: (built by :func:`build_arm`, offered by :func:`ranked_starts` on mixed speeds; not an arm).
SLOW_FIRST = "slow-first"
#: The ranker shipped beside the default policy.
DEFAULT_RANKER = Path(__file__).resolve().parents[1] / "policies" / "default_starts.pt"


@dataclass(frozen=True)
class Arm:
    """One recipe on one scenario: a candidate (editable) or a named plan (``method``, ``balanced``)."""

    name: str
    candidate: Candidate | None = None
    method: str | None = None
    balanced: bool = False


def scenario_features(scenario: Scenario) -> np.ndarray:
    """:data:`FEATURES` of a scenario: sizes, how heavy the head, embedding and largest layer are
    against an even stage, how uneven the layers are, link cost, how much memory the weights take
    and how many micro-batches of activations fit, nodes, device speeds, layer kinds."""
    prof, cl = scenario.profile, scenario.cluster
    P, M, L = scenario.devices, scenario.microbatches, prof.num_layers
    cost = np.array([x.f + x.b + x.w for x in prof.layers], dtype=np.float64)
    stage = max(float(cost.sum()) / P, 1e-12)
    act = float(sum(x.act_bytes for x in prof.layers))
    static = sum(x.params for x in prof.layers) * scenario.training.bytes_per_param / P
    limit = float(np.mean(cl.memory_limits_bytes))
    room = limit - static
    fit = room / max(act / P, 1.0) if room > 0 else 0.0
    comm = cl.transfer_seconds(0, min(1, P - 1), max(x.out_bytes for x in prof.layers)) / prof.seconds_per_unit
    names = [x.name for x in prof.layers]
    moe = sum("moe" in n.lower() for n in names) / L
    mixer = sum(any(k in n.lower() for k in ("mamba", "linear", "sliding")) for n in names) / L
    speeds = np.asarray(cl.speeds, dtype=np.float64)
    nodes = (P - 1) // (cl.gpus_per_node or P) + 1
    x = [math.log2(P) / 5, math.log2(M) / 8, math.log2(L) / 8, math.log2(M / P) / 4,
         float(cost[-1]) / stage, float(cost[0]) / stage, float(cost.max()) / stage,
         float(cost.std() / max(cost.mean(), 1e-12)),
         comm / max(float(cost.mean()), 1e-12), static / limit, math.log2(max(fit, 0.5) / P) / 4, float(nodes > 1),
         float(speeds.max() / speeds.min() - 1.0), moe, mixer, L / P / 8]
    return np.clip(np.asarray(x, dtype=np.float32), -8.0, 8.0)


def build_arm(name: str, scenario: Scenario, ev: Evaluator) -> Arm | None:
    """The recipe ``name`` (one of :data:`ARMS`, built by :mod:`pipeline.start_recipes`) on
    ``scenario``, or None where it does not apply. Only what this recipe needs is computed (its
    split, its costs)."""
    P, L = scenario.devices, scenario.profile.num_layers
    parts = name.split(":")
    if parts[0] == "named":
        return Arm(name, method=parts[1], balanced=parts[2] == "dp")
    order = None
    if parts[-1] == SLOW_FIRST:  # pipeline positions by device speed, fastest last
        order = slow_first(scenario.cluster.speeds)
        if order is None:
            return None
        parts = parts[:-1]
    match = re.fullmatch(r"([a-z]+)(\d+)", parts[1])
    assert match is not None, name
    kind, chunks = match.group(1), int(match.group(2))
    if P * chunks > L or (chunks > 1 and P < 2):
        return None
    placement = make_placement(kind, P, chunks)
    if order is not None:
        placement = tuple(order[d] for d in placement)
    sizes = split_sizes(ev, placement, parts[2])
    if sizes is None:
        return None
    if parts[0] == "fixed":
        return Arm(name, fixed_order_candidate(sizes, placement, devices=P))
    rule = parts[3]
    if rule == "filled":
        return Arm(name, with_filled_budgets(Candidate(sizes, placement, "list"), ev))
    if rule == "roomy":  # deeper than filled; ":w2": at most 2 Ws pending per device (few kept shares
        # at once, as the budgets assume); ":rc0": device 0's stages recompute, budgets refilled
        recompute = tuple(d == 0 for d in placement) if "rc0" in parts[4:] else None
        return Arm(name, with_roomy_budgets(Candidate(sizes, placement, "list", recompute=recompute,
                                                      max_pending_w=2 if "w2" in parts[4:] else None), ev))
    if rule == "recompute":  # where nothing else fits: every stage recomputes (fused B), budgets cut to fit
        c = recompute_candidate(sizes, placement, ev)
        return None if c is None else Arm(name, c)
    preset = None if rule == "unlimited" else rule
    if len(parts) == 5:  # ":fit": cut to the memory left after the static share
        c = fit_candidate(sizes, placement, ev, preset=rule, device_order=order)
        return None if c is None else Arm(name, c)
    return Arm(name, preset_candidate(sizes, placement, preset, devices=P, device_order=order))


def arm_candidates(scenario: Scenario, ev: Evaluator) -> dict[str, Arm]:
    """Every recipe that applies to ``scenario``, by name (a subset of :data:`ARMS`)."""
    arms = ((name, build_arm(name, scenario, ev)) for name in ARMS)
    return {name: arm for name, arm in arms if arm is not None}


def named_result(arm: Arm, scenario: Scenario, ev: Evaluator):
    """(plan, result) of a named arm (one counted simulator call), or (None, None) when it does not apply."""
    try:
        plan = named_schedule_plan(ev, arm.method, balanced=arm.balanced)
    except PlanError:
        return None, None
    return plan, ev.simulate_plan(plan)


def _arm_times(scenario: Scenario) -> np.ndarray:
    """Iteration time of every arm on ``scenario`` (inf: infeasible; nan: does not apply)."""
    ev = Evaluator(scenario)
    arms = arm_candidates(scenario, ev)
    out = np.full(len(ARMS), np.nan)
    cands = [a.candidate for a in arms.values() if a.candidate is not None]
    ev.results(cands)
    for i, name in enumerate(ARMS):
        arm = arms.get(name)
        if arm is None:
            continue
        res = ev.result(arm.candidate) if arm.candidate is not None else named_result(arm, scenario, ev)[1]
        if res is None:
            continue
        out[i] = res.iteration_time if res.feasible else np.inf
    return out


def collect_arm_labels(n: int, *, seed: int, progress: Callable[[int], None] | None = None
                       ) -> tuple[np.ndarray, np.ndarray]:
    """(features, arm times) of ``n`` scenarios drawn from :data:`env.scenarios.TRAIN_SCENARIO`."""
    from env.scenarios import TRAIN_SCENARIO, sample_scenario

    rng = np.random.default_rng(seed)
    feats, times = [], []
    while len(feats) < n:
        scenario = sample_scenario(rng, TRAIN_SCENARIO)
        t = _arm_times(scenario)
        if not np.isfinite(t).any():
            continue  # nothing fits: no ranking to learn
        feats.append(scenario_features(scenario))
        times.append(t)
        if progress is not None:
            progress(1)
    return np.stack(feats), np.stack(times)


def _collect_worker(args: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    return collect_arm_labels(args[0], seed=args[1])


def _targets(times: np.ndarray, temperature: float) -> tuple[np.ndarray, np.ndarray]:
    """(target distribution, applicable mask) from arm times (:func:`agents.listwise.listwise_targets`)."""
    return listwise_targets(times, temperature), ~np.isnan(times)


class StartRanker:
    """MLPs from :data:`FEATURES` to one score per arm of :data:`ARMS` (higher: simulate first).

    ``members`` networks, initialised differently and fitted to the same labels; a recipe's score
    is the mean of their log-probabilities. One network's top recipes swing with its
    initialisation (over four seeds, the worst held-out scenario's best-of-top-10 ranged from 0.93
    to 0.98 of the tuner); the mean of four does not depend on one draw.
    """

    def __init__(self, hidden: int = 128, seed: int = 0, members: int = 4) -> None:
        import torch as th

        th.manual_seed(seed)
        self.hidden, self.members = hidden, members
        self.net = th.nn.ModuleList(
            th.nn.Sequential(th.nn.Linear(len(FEATURES), hidden), th.nn.ReLU(), th.nn.Linear(hidden, hidden),
                             th.nn.ReLU(), th.nn.Linear(hidden, len(ARMS)))
            for _ in range(members))

    def logits(self, x: Any) -> Any:
        """The members' mean log-probability per arm (a torch tensor of shape ``(n, len(ARMS))``)."""
        import torch as th

        return th.stack([th.log_softmax(m(x), dim=1) for m in self.net]).mean(0)

    def scores(self, features: np.ndarray) -> np.ndarray:
        import torch as th

        with th.no_grad():
            return self.logits(th.as_tensor(features, dtype=th.float32)).numpy()


def fit_ranker(ranker: StartRanker, features: np.ndarray, times: np.ndarray, *, epochs: int = 300,
               lr: float = 3e-3, temperature: float = 0.2, seed: int = 0) -> dict[str, float]:
    """Listwise cross-entropy over the applicable arms, each member on its own; returns the
    held-back tenth's top-1 and best-of-top-3 quality (best time / the picked arm's time,
    geometric mean) of the ensemble. ``temperature`` 0.2 had the best held-back top-1 and top-3
    of 0.02, 0.1 and 0.2 on 9,000 scenarios (docs/rl.md)."""
    import torch as th

    target, applicable = _targets(times, temperature)
    n = len(features)
    order = np.random.default_rng(seed).permutation(n)
    held, train = order[: max(1, n // 10)], order[max(1, n // 10):]
    x = th.as_tensor(features, dtype=th.float32)
    t = th.as_tensor(target, dtype=th.float32)
    m = th.as_tensor(applicable)
    for member in ranker.net:
        opt = th.optim.Adam(member.parameters(), lr=lr, weight_decay=1e-4)
        for _ in range(epochs):
            for i in range(0, len(train), 256):
                idx = th.as_tensor(train[i:i + 256])
                logits = member(x[idx]).masked_fill(~m[idx], -1e9)
                loss = -(t[idx] * th.log_softmax(logits, dim=1)).sum(1).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
    return {"held_top1_quality": _quality(ranker, features[held], times[held], 1),
            "held_top3_quality": _quality(ranker, features[held], times[held], 3), "scenarios": n}


def _quality(ranker: StartRanker, features: np.ndarray, times: np.ndarray, k: int) -> float:
    scores = np.where(np.isnan(times), -np.inf, ranker.scores(features))
    best = np.nanmin(np.where(np.isfinite(times), times, np.nan), axis=1)
    top = np.argsort(-scores, axis=1)[:, :k]
    picked = np.min(np.take_along_axis(np.where(np.isnan(times), np.inf, times), top, axis=1), axis=1)
    q = np.where(np.isfinite(picked), best / picked, 1e-3)
    return float(np.exp(np.mean(np.log(q))))


def train_ranker(n: int, *, seed: int = 0, workers: int = 2, out: str | Path | None = None,
                 progress_bar: bool = True) -> tuple[StartRanker, dict[str, Any]]:
    """Label ``n`` training scenarios in ``workers`` processes, fit a ranker, save it to ``out``."""
    import multiprocessing as mp

    from tqdm import tqdm

    t0 = time.perf_counter()
    shares = [n // workers + (i < n % workers) for i in range(workers)]
    jobs = [(k, seed * 1000 + 700 + i) for i, k in enumerate(shares) if k]
    with tqdm(total=n, desc="start ranker: label scenarios", unit="scenario", disable=not progress_bar) as bar:
        if len(jobs) == 1:
            parts = [collect_arm_labels(jobs[0][0], seed=jobs[0][1], progress=bar.update)]
        else:
            with mp.get_context("spawn").Pool(len(jobs)) as pool:
                parts = pool.map(_collect_worker, jobs)
            bar.update(n)
    features = np.concatenate([p[0] for p in parts])
    times = np.concatenate([p[1] for p in parts])
    collected = time.perf_counter() - t0
    ranker = StartRanker(seed=seed)
    metrics = fit_ranker(ranker, features, times, seed=seed)
    summary = {**metrics, "collect_seconds": round(collected, 1),
               "fit_seconds": round(time.perf_counter() - t0 - collected, 1), "seed": seed}
    if out is not None:
        save_ranker(ranker, out, extra=summary)
    return ranker, summary


def save_ranker(ranker: StartRanker, path: str | Path, *, extra: dict[str, Any] | None = None) -> Path:
    """Write the ranker's weights (``.pt`` state dict) and its ``.json`` metadata (arms, features)."""
    import torch as th

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    th.save(ranker.net.state_dict(), path)
    meta = {"format": "adaptis-start-ranker/2", "arms": list(ARMS), "features": list(FEATURES),
            "hidden": ranker.hidden, "members": ranker.members, **(extra or {})}
    path.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    return path


_RANKERS: dict[str, StartRanker] = {}


def load_ranker(path: str | Path | None = None) -> StartRanker:
    """The ranker at ``path`` (default :data:`DEFAULT_RANKER`); ConfigError when it was trained
    for other arms or features than this version has."""
    import torch as th

    path = Path(path) if path is not None else DEFAULT_RANKER
    key = str(path.resolve())
    if key in _RANKERS:
        return _RANKERS[key]
    meta_path = path.with_suffix(".json")
    if not path.is_file() or not meta_path.is_file():
        raise ConfigError(f"start ranker {path} (and its .json) not found; train one with python -m experiments "
                          "train --ranker-scenarios N", field="--ranker")
    from agents.rl.policy import read_metadata

    meta = read_metadata(path, what="start ranker", field="--ranker")
    if meta.get("arms") != list(ARMS) or meta.get("features") != list(FEATURES):
        raise ConfigError(f"start ranker {path} was trained for other arms or features; retrain it", field="--ranker")
    if meta.get("format") != "adaptis-start-ranker/2":
        raise ConfigError(f"start ranker {path} has format {meta.get('format')!r}, this version reads "
                          "adaptis-start-ranker/2; retrain it", field="--ranker")
    try:
        ranker = StartRanker(hidden=int(meta.get("hidden", 128)), members=int(meta.get("members", 4)))
        ranker.net.load_state_dict(th.load(path, weights_only=True))
    except Exception as exc:  # a corrupt or truncated file, or weights of another shape
        from agents.rl.policy import unreadable

        raise unreadable(path, exc, what="start ranker", field="--ranker") from None
    ranker.net.eval()
    _RANKERS[key] = ranker
    return ranker


def fits_by_construction(name: str) -> bool:
    """Whether a recipe's budgets are cut to fit memory (``:fit``, ``:filled``, ``:recompute``):
    such a plan fits when any plan of its layout fits, while deeper recipes may overflow."""
    parts = name.removesuffix(f":{SLOW_FIRST}").split(":")
    return parts[0] == "list" and parts[-1] in ("fit", "filled", "recompute")


def holds_one_microbatch(c: Candidate | None, ev: Evaluator) -> bool:
    """Whether every device of ``c``'s layout holds its static memory and one micro-batch (what
    :func:`fits_by_construction` assumes; no simulation). False for a named recipe."""
    if c is None:
        return False
    costs = ev.costs(c.sizes, c.placement, c.recompute)
    return cut_budgets(costs, c.placement, (1.0,) * ev.scenario.devices, split_backward=c.split_backward) is not None


def ranked_starts(scenario: Scenario, ev: Evaluator, ranker: StartRanker, *, k: int,
                  deadline: float | None = None, speed_twins: bool = True) -> list[Arm]:
    """The ``k`` applicable arms the ranker scores highest, best first, one of them a recipe that
    fits by construction (:func:`fits_by_construction`, on a layout that holds one micro-batch:
    :func:`holds_one_microbatch`; the best-scored one, last, where the others are not): the
    deepest recipes overflow together, so a list of them alone can hold no plan that fits. Only
    those are built; after ``deadline``, a ``time.perf_counter()`` value, no more once one is built.
    With ``speed_twins``, on devices of mixed speeds, each list recipe is
    followed by its :data:`SLOW_FIRST` twin (the same recipe with the devices ordered slowest
    first, fastest last; not scored: the ranker learns the recipes in index order only), so up to
    ``2 k`` arms come back and the starts cover both device orders."""
    scores = ranker.scores(scenario_features(scenario)[None])[0]
    out: list[Arm] = []
    safe = False
    for i in np.argsort(-scores, kind="stable"):
        if out and deadline is not None and time.perf_counter() >= deadline:
            break
        name = ARMS[int(i)]
        last = len(out) == k - 1 and k > 1 and not safe
        if last and not fits_by_construction(name):
            continue
        arm = build_arm(name, scenario, ev)
        if arm is None:
            continue
        sure = fits_by_construction(name) and holds_one_microbatch(arm.candidate, ev)
        if last and not sure:
            continue
        out.append(arm)
        safe = safe or sure
        if len(out) == k:
            break
    if speed_twins and slow_first(scenario.cluster.speeds) is not None:
        twins = (build_arm(f"{a.name}:{SLOW_FIRST}", scenario, ev) if a.name.startswith("list:") else None for a in out)
        out = [x for a, t in zip(out, twins) for x in (a, t) if x is not None]
    return out
