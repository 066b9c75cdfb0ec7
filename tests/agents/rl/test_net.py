"""agents.rl.net: the entity network's outputs against its definition (layers over concatenations)."""

from __future__ import annotations

import torch as th
from torch import nn

from agents.rl.net import EntityEncoder
from env.editor import MAX_DEVICES, MAX_STAGES
from env.pipeline_env import observation_space


def _masked_pool(h: th.Tensor, present: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
    """Mean and max over the present rows (the padding pushed far below any row); every
    observation has stage and device rows."""
    count = present.sum(1).clamp(min=1.0)
    return (h * present).sum(1) / count, (h - (1.0 - present) * 1e4).max(1).values


def _reference(enc: EntityEncoder, obs: dict[str, th.Tensor]) -> th.Tensor:
    """The encoder as the module docstring defines it: each layer applied to the concatenated inputs."""
    from agents.rl import net

    st, dv, g = obs["stages"], obs["devices"], obs["plan"]
    n_s = max(2, int(st[..., 0].sum(1).max().item()))
    n_d = max(1, int(dv[..., 0].sum(1).max().item()))
    st, dv = st[:, :n_s], dv[:, :n_d]
    ps, pd = st[..., :1], dv[..., :1]
    hs, hd = enc.stage_in(st) * ps, enc.device_in(dv) * pd
    ms, xs = _masked_pool(hs, ps)
    md, xd = _masked_pool(hd, pd)
    ctx = enc.context(th.cat([ms, xs, md, xd, enc.global_in(g)], dim=1))
    ts = enc.stage_out(th.cat([hs, ctx[:, None].expand(-1, hs.shape[1], -1)], dim=2))
    td = enc.device_out(th.cat([hd, ctx[:, None].expand(-1, hd.shape[1], -1)], dim=2))
    pair = nn.functional.pad(enc.boundary_head(th.cat([ts[:, :-1], ts[:, 1:]], dim=2)), (0, 0, 0, MAX_STAGES - n_s))
    dev = nn.functional.pad(enc.device_head(td), (0, 0, 0, MAX_DEVICES - n_d))
    glob = enc.global_head(ctx)
    mid = net._G_MID
    logits = th.cat([glob[:, :1], pair[..., 0], pair[..., 1], glob[:, 1:1 + mid], dev[..., 0], dev[..., 1],
                     glob[:, 1 + mid:]], dim=1)
    return th.cat([ctx, logits], dim=1)


def test_encoder_matches_its_definition_with_padding_rows() -> None:
    th.manual_seed(0)
    space = observation_space()
    enc = EntityEncoder(space, hidden=16)
    for head in (enc.boundary_head, enc.device_head, enc.global_head):  # the policy's 0.01 gain hides errors
        nn.init.normal_(head.weight)
    batch = 5
    obs = {k: th.rand(batch, *v.shape) for k, v in space.spaces.items()}
    for rows, key in ((MAX_STAGES, "stages"), (MAX_DEVICES, "devices")):
        present = th.zeros(batch, rows)
        for b in range(batch):
            present[b, : 2 + 3 * b] = 1.0  # a different number of rows per sample, the rest padding
        obs[key][..., 0] = present
    out = enc(obs)
    ref = _reference(enc, obs)
    assert out.shape == ref.shape == (batch, enc.features_dim)
    th.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    grads = th.autograd.grad(out.square().sum(), list(enc.parameters()))
    ref_grads = th.autograd.grad(_reference(enc, obs).square().sum(), list(enc.parameters()))
    for a, b in zip(grads, ref_grads):
        th.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
