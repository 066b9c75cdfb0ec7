"""Real layers and the model builder: shapes, determinism, stage weights, the chunked scan."""

from __future__ import annotations

import pytest
import torch

from executor.layers import _decay_mix
from executor.model import (
    build_model,
    build_stage,
    make_batch,
    resolve_architecture,
    scale_architecture,
    tiny_hybrid_architecture,
)


@pytest.fixture(scope="module")
def arch():
    return resolve_architecture("tiny-hybrid")


def test_every_layer_kind_is_built(arch) -> None:
    labels = {layer.label for layer in arch.layers}
    assert {"embedding", "head", "mamba"} <= labels
    assert any("moe" in x for x in labels) and any("linear_attention" in x for x in labels)


def test_model_trains_and_every_parameter_gets_a_gradient(arch) -> None:
    model = build_model(arch, seed=0)
    tokens, labels = make_batch(arch, batch=2, seq_len=32)
    loss = model(tokens, labels)
    assert loss.dim() == 0 and 0 < float(loss.detach()) < 20
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing


def test_init_is_deterministic_and_stages_match_the_model(arch) -> None:
    a, b = build_model(arch, seed=3), build_model(arch, seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    stage = build_stage(arch, 2, 5, seed=3)
    full = dict(a.named_parameters())
    for name, p in stage.named_parameters():
        assert torch.equal(p, full[name]), name
    c = build_model(arch, seed=4)
    assert not torch.equal(a.layers["1"].ffn.up.weight, c.layers["1"].ffn.up.weight)


def test_stage_chain_equals_model(arch) -> None:
    model = build_model(arch)
    tokens, labels = make_batch(arch, batch=1, seq_len=16)
    h = build_stage(arch, 0, 3)(tokens)
    loss = build_stage(arch, 3, len(arch.layers))(h, labels)
    assert torch.allclose(loss, model(tokens, labels), rtol=1e-6)


@pytest.mark.parametrize("chunk", [3, 4, 64])
def test_chunked_decay_mix_matches_the_recurrence(chunk: int) -> None:
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 10, 3, generator=g), torch.randn(1, 2, 10, 3, generator=g)
    v, log_decay = torch.randn(1, 2, 10, 4, generator=g), -torch.rand(1, 2, 10, generator=g)
    state, ys = torch.zeros(1, 2, 3, 4), []
    for t in range(10):
        state = state * log_decay[:, :, t].exp()[..., None, None] + k[:, :, t, :, None] * v[:, :, t, None, :]
        ys.append((q[:, :, t, None, :] @ state).squeeze(2))
    assert torch.allclose(_decay_mix(q, k, v, log_decay, chunk), torch.stack(ys, 2), atol=1e-5)


def test_causality(arch) -> None:
    """Changing a later token never changes an earlier position's hidden state."""
    stage = build_stage(arch, 0, len(arch.layers) - 1)
    tokens, _ = make_batch(arch, batch=1, seq_len=24)
    other = tokens.clone()
    other[0, 20:] = (other[0, 20:] + 1) % arch.vocab_size
    assert torch.allclose(stage(tokens)[:, :20], stage(other)[:, :20], atol=1e-5)


def test_scale_shrinks_a_zoo_model() -> None:
    small = scale_architecture(tiny_hybrid_architecture(), 0.25)
    assert small.hidden_size == 16 and small.vocab_size == 2048
    model = build_model(small)
    tokens, labels = make_batch(small, batch=1, seq_len=8)
    assert torch.isfinite(model(tokens, labels))


def test_head_shards_compute_the_whole_heads_loss_and_gradients() -> None:
    from executor.model import build_model, named_grads, resolve_architecture

    whole, split = resolve_architecture("tiny-hybrid"), resolve_architecture("tiny-hybrid", head_shards=3)
    tokens, labels = make_batch(whole, batch=2, seq_len=16)
    a, b = build_model(whole), build_model(split)
    la, lb = a(tokens, labels), b(tokens, labels=labels)
    assert torch.allclose(la, lb, rtol=1e-6)
    la.backward()
    lb.backward()
    ga, gb = named_grads([a]), named_grads([b])
    n = len(whole.layers) - 1
    assert set(gb) == set(ga)  # the shards share the head's parameters (one name each)
    head = f"layers.{n}.proj.weight"
    assert torch.allclose(ga[head], gb[head], rtol=1e-5, atol=1e-8)


def test_recomputing_stage_saves_only_its_inputs_and_gives_the_same_gradients() -> None:
    from executor.model import build_stage, named_grads, resolve_architecture

    arch = resolve_architecture("tiny-hybrid", granularity="sublayer")
    tokens, labels = make_batch(arch, batch=1, seq_len=16)
    saved: dict[bool, int] = {}
    grads = {}
    for recompute in (False, True):
        first = build_stage(arch, 0, 4)
        stage = build_stage(arch, 4, 9, recompute=recompute)
        last = build_stage(arch, 9, len(arch.layers))
        h = first(tokens).detach().requires_grad_(True)
        sizes: list[int] = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t, sizes=sizes: sizes.append(t.numel()) or t,
                                                      lambda t: t):
            out = stage(h)
        saved[recompute] = sum(sizes)
        last(out, labels=labels).backward()
        grads[recompute] = named_grads([stage])
    assert saved[True] < saved[False] / 5
    for name, g in grads[False].items():
        assert torch.allclose(g, grads[True][name], rtol=1e-5, atol=1e-7), name
