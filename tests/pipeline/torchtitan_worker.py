"""Run our torchtitan exports with torchtitan 0.3.0's own pipeline functions on 2 gloo ranks.

Usage (under torchrun, 2 processes): ``python tests/pipeline/torchtitan_worker.py A.toml [B.toml ...]``.
For each fragment: torchtitan's ``ParallelismConfig`` is built from its ``[parallelism]`` table,
``_pipeline_module_split`` cuts a tiny torchtitan-style decoder (``tok_embeddings``,
``layers`` as a ModuleDict, ``norm``, ``lm_head``; the blocks are tiny-hybrid's real layers:
attention, MoE, Mamba-2, linear attention) into the fragment's stages, ``_build_pipeline_schedule``
loads the fragment's CSV (``_PipelineScheduleRuntime``), and a few SGD steps run. Rank 0 prints
``TITAN-OK <schedule> <max relative gradient error> <max weight error>`` when the first step's
gradients and the weights after the last step equal the unpipelined model's.
"""

from __future__ import annotations

import copy
import sys
import tomllib
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torchtitan.config import ParallelismConfig  # noqa: E402
from torchtitan.distributed.pipeline_parallel import _build_pipeline_schedule, _pipeline_module_split  # noqa: E402

from executor.layers import RMSNorm  # noqa: E402
from executor.model import build_layers, resolve_architecture  # noqa: E402

STEPS = 2
SEQ = 16
LR = 0.5


class TinyDecoder(nn.Module):
    """torchtitan's decoder layout (its ``Decoder.forward`` passes through deleted modules)."""

    def __init__(self) -> None:
        super().__init__()
        arch = resolve_architecture("tiny-hybrid")
        self.vocab = arch.vocab_size
        blocks = build_layers(arch, range(1, len(arch.layers) - 1), seed=0)
        torch.manual_seed(0)
        self.tok_embeddings = nn.Embedding(arch.vocab_size, arch.hidden_size)
        self.layers = nn.ModuleDict({str(i - 1): blocks[i] for i in sorted(blocks)})
        self.norm = RMSNorm(arch.hidden_size)
        self.lm_head = nn.Linear(arch.hidden_size, arch.vocab_size, bias=False)
        nn.init.normal_(self.tok_embeddings.weight, std=0.02)
        nn.init.normal_(self.lm_head.weight, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h)
        h = self.norm(h) if self.norm is not None else h
        return self.lm_head(h) if self.lm_head is not None else h


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
    """torchtitan's loss protocol: ``(loss, token count)``."""
    return F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten()), labels.numel()


def run_fragment(path: str, mesh, rank: int) -> None:
    raw = tomllib.loads(Path(path).read_text())
    parallelism = ParallelismConfig(**raw["parallelism"])
    batch = int(raw["training"]["local_batch_size"])
    whole = TinyDecoder()
    reference = copy.deepcopy(whole)
    stages, parts = _pipeline_module_split(whole, mesh, parallelism.pipeline_parallel_schedule, torch.device("cpu"),
                                           parallelism.module_fqns_per_model_part)
    schedule = _build_pipeline_schedule(parallelism=parallelism, local_batch_size=batch, stages=stages,
                                        loss_fn=loss_fn)
    n_mb = batch // parallelism.pipeline_parallel_microbatch_size
    params = [p for m in parts for p in m.parameters()]
    opt = torch.optim.SGD(params, lr=LR)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=LR)
    gen = torch.Generator().manual_seed(1)
    grad_err = 0.0
    for step in range(STEPS):
        data = torch.randint(0, whole.vocab, (batch, SEQ + 1), generator=gen)
        tokens, labels = data[:, :-1].contiguous(), data[:, 1:].contiguous()
        opt.zero_grad()
        schedule.step(tokens, target=labels, return_outputs=False)
        ref_opt.zero_grad()
        for t, lab in zip(tokens.chunk(n_mb), labels.chunk(n_mb)):  # scale_grads=False: losses add up
            loss_fn(reference(t), lab)[0].backward()
        if step == 0:
            want = dict(reference.named_parameters())
            for m in parts:
                for name, p in m.named_parameters():
                    ref = want[name].grad
                    grad_err = max(grad_err, float((p.grad - ref).abs().max() / (ref.abs().max() + 1e-12)))
        opt.step()
        ref_opt.step()
    want = dict(reference.named_parameters())
    weight_err = max(float((p.detach() - want[n].detach()).abs().max()) for m in parts for n, p in m.named_parameters())
    errs = torch.tensor([grad_err, weight_err])
    dist.all_reduce(errs, op=dist.ReduceOp.MAX)
    held = torch.tensor([len(stages)])
    dist.all_reduce(held)
    if rank == 0:
        print(f"TITAN-OK {parallelism.pipeline_parallel_schedule} {float(errs[0]):.3e} {float(errs[1]):.3e} "
              f"stages={int(held[0])}", flush=True)


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("pp",))
    for path in sys.argv[1:]:
        run_fragment(path, mesh, rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
