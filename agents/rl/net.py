"""A policy network that is not tied to one size: one set of weights for 2-32 devices, 2-128 stages.

:class:`EntityEncoder` reads the ``stages`` and ``devices`` rows of ``adaptis/Pipeline-v0``'s
observation as sets of tokens (rows whose ``present`` column is 0 are padding and are ignored):

1. each stage row, each device row and the ``plan`` vector go through their own small MLP;
2. a context vector pools the tokens (masked mean and max, so the pooling ignores the order and
   the number of rows) and mixes them with the plan vector;
3. each token is refined with the context (the same weights for every row);
4. action logits come from the entities they act on: ``grow-left(i)`` / ``grow-right(i)`` from
   the pair of stage tokens ``(i, i+1)``, ``budget-up(d)`` / ``budget-down(d)`` from device token
   ``d``, every other action (stop, placement families, presets, knobs...) from the context.

So adding devices or stages adds rows, not weights; the value comes from the context.
:class:`EntityPolicy` plugs the encoder into sb3-contrib's ``MaskableActorCriticPolicy`` (the
encoder's output carries the logits; the action head only slices them out).
"""

from __future__ import annotations

from typing import Any

import torch as th
from gymnasium import spaces
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from torch import nn

from env.editor import BUDGET_DOWN, BUDGET_UP, GLOBAL_ACTIONS, GROW_LEFT, GROW_RIGHT, MAX_DEVICES, MAX_STAGES, N_ACTIONS

__all__ = ["EntityEncoder", "EntityPolicy"]

_N_GLOBAL = len(GLOBAL_ACTIONS)
# GLOBAL_ACTIONS is stop, then the block between grow-right and budget-up, then the tail.
_G_MID = BUDGET_UP - (GROW_RIGHT + MAX_STAGES - 1)
assert GROW_LEFT == 1 and GROW_RIGHT == GROW_LEFT + MAX_STAGES - 1 and BUDGET_DOWN == BUDGET_UP + MAX_DEVICES
assert 1 + _G_MID + (N_ACTIONS - BUDGET_DOWN - MAX_DEVICES) == _N_GLOBAL


def _mlp(n_in: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())


class EntityEncoder(BaseFeaturesExtractor):
    """Tokens -> context + per-action logits (see the module docstring). Output:
    ``[context (hidden) | logits (N_ACTIONS)]``."""

    def __init__(self, observation_space: spaces.Dict, hidden: int = 64) -> None:
        super().__init__(observation_space, features_dim=hidden + N_ACTIONS)
        ns = observation_space["stages"].shape[1]
        nd = observation_space["devices"].shape[1]
        ng = observation_space["plan"].shape[0]
        self.hidden = hidden
        self.stage_in = _mlp(ns, hidden)
        self.device_in = _mlp(nd, hidden)
        self.global_in = _mlp(ng, hidden)
        self.context = _mlp(5 * hidden, hidden)
        self.stage_out = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.ReLU())
        self.device_out = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.ReLU())
        self.boundary_head = nn.Linear(2 * hidden, 2)
        self.device_head = nn.Linear(hidden, 2)
        self.global_head = nn.Linear(hidden, _N_GLOBAL)

    @staticmethod
    def _pool(h: th.Tensor, count: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        """Mean and max over the present rows of ``h`` (``count`` of them per sample). ``h`` is a
        ReLU's output with padding rows 0: no row is below 0, so the plain sum and max over all
        rows are the masked ones (a row tied at 0 with padding has no gradient through its ReLU
        either way; ``amax`` shares a tie's gradient among equal rows, which for the weights is
        the same). Every observation has stage and device rows."""
        return h.sum(1) / count, h.amax(1)

    def forward(self, obs: dict[str, th.Tensor]) -> th.Tensor:
        st, dv, g = obs["stages"], obs["devices"], obs["plan"]
        # Padding rows carry nothing: work on the rows some sample of the batch uses, and run the
        # token layers on the present rows only (a batch's samples differ in size: about a third of
        # its rows up to the largest sample are present).
        n_s = max(2, int(st[..., 0].sum(1).max().item()))
        n_d = max(1, int(dv[..., 0].sum(1).max().item()))
        st, dv = st[:, :n_s], dv[:, :n_d]
        ps, pd = _Rows(st), _Rows(dv)
        hs, hd = self.stage_in(ps.take(st)), self.device_in(pd.take(dv))
        ms, xs = self._pool(ps.put(hs), ps.count)
        md, xd = self._pool(pd.put(hd), pd.count)
        ctx = self.context(th.cat([ms, xs, md, xd, self.global_in(g)], dim=1))
        ts = _refined(self.stage_out[0], hs, ps, ctx)
        td = _refined(self.device_out[0], hd, pd, ctx)
        pair = nn.functional.pad(_pairs(self.boundary_head, ts), (0, 0, 0, MAX_STAGES - n_s))
        dev = nn.functional.pad(self.device_head(td), (0, 0, 0, MAX_DEVICES - n_d))
        glob = self.global_head(ctx)
        logits = th.cat([glob[:, :1], pair[..., 0], pair[..., 1], glob[:, 1:1 + _G_MID], dev[..., 0], dev[..., 1],
                         glob[:, 1 + _G_MID:]], dim=1)
        return th.cat([ctx, logits], dim=1)


class _Rows:
    """The present rows of a ``(B, N, F)`` batch of tokens (column 0 is ``present``): the token
    layers run on them alone (``(P, F)``), :meth:`put` puts their outputs back in the batch's layout."""

    def __init__(self, x: th.Tensor) -> None:
        present = x[..., 0] > 0.5
        self.shape = present.shape
        self.index = present.reshape(-1).nonzero().squeeze(1)
        """Each present row's position in the flattened ``(B x N)`` rows (row-major)."""
        self.sample = self.index // self.shape[1]
        """Each present row's sample."""
        self.count = present.sum(1, keepdim=True).clamp(min=1)

    def take(self, x: th.Tensor) -> th.Tensor:
        return x.reshape(-1, x.shape[-1]).index_select(0, self.index)

    def put(self, rows: th.Tensor, fill: th.Tensor | None = None) -> th.Tensor:
        """``(B, N, H)``: ``rows`` at their places, the padding rows 0 or ``fill`` (one row per sample)."""
        b, n = self.shape
        base = rows.new_zeros(b * n, rows.shape[-1]) if fill is None else fill.repeat_interleave(n, dim=0)
        return base.index_copy(0, self.index, rows).view(b, n, -1)


def _refined(layer: nn.Linear, tokens: th.Tensor, rows: _Rows, ctx: th.Tensor) -> th.Tensor:
    """``relu(layer(cat([token, context])))`` of every row (``tokens``: the present rows, ``(P, H)``),
    in the batch's layout: the context's half of the weights applied once per sample, not once per
    row (the same weights and result without the concatenation), and a padding row (token 0) is
    ``relu`` of the context's half alone."""
    h = tokens.shape[-1]
    per_sample = nn.functional.linear(ctx, layer.weight[:, h:], layer.bias)
    out = nn.functional.linear(tokens, layer.weight[:, :h]) + per_sample.index_select(0, rows.sample)
    return th.relu(rows.put(out, per_sample))


def _pairs(layer: nn.Linear, tokens: th.Tensor) -> th.Tensor:
    """``layer(cat([tokens[:, :-1], tokens[:, 1:]], -1))`` (each pair of neighbours) without the concatenation."""
    h = tokens.shape[-1]
    return (nn.functional.linear(tokens[:, :-1], layer.weight[:, :h], layer.bias)
            + nn.functional.linear(tokens[:, 1:], layer.weight[:, h:]))


class _Slice(nn.Module):
    def __init__(self, start: int, stop: int) -> None:
        super().__init__()
        self.start, self.stop = start, stop

    def forward(self, x: th.Tensor) -> th.Tensor:
        return x[:, self.start:self.stop]


class EntityPolicy(MaskableActorCriticPolicy):
    """MaskablePPO's actor-critic with :class:`EntityEncoder` (``hidden`` units per token)."""

    def __init__(self, *args: Any, hidden: int = 64, **kwargs: Any) -> None:
        self.hidden = hidden
        kwargs["features_extractor_class"] = EntityEncoder
        kwargs["features_extractor_kwargs"] = {"hidden": hidden}
        kwargs["net_arch"] = {"pi": [], "vf": []}
        super().__init__(*args, **kwargs)

    def _build(self, lr_schedule) -> None:
        super()._build(lr_schedule)
        H = self.hidden
        self.action_net = _Slice(H, H + N_ACTIONS)
        self.value_net = nn.Sequential(_Slice(0, H), nn.Linear(H, H), nn.Tanh(), nn.Linear(H, 1))
        enc = self.features_extractor
        for head in (enc.boundary_head, enc.device_head, enc.global_head):
            nn.init.orthogonal_(head.weight, gain=0.01)
            nn.init.zeros_(head.bias)
        self.optimizer = self.optimizer_class(self.parameters(), lr=lr_schedule(1), **self.optimizer_kwargs)

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data["hidden"] = self.hidden
        return data
