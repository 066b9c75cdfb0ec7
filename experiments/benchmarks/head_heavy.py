"""A synthetic head-heavy table: what the memory-bound loss and the GEMM shape efficiency do to MFU and memory.

A GPT (hidden 3072, 32 layers, 24 heads, 4h MLP, FlashAttention) on 8 A100s, PP 8, Megatron's 1F1B,
128 micro-batches of one sequence, vocabulary 32k to 256k, sequence 2048 and 4096, on the
``megatron`` runtime model. No measured rows: it prints the model's MFU and peak memory (GiB, the
fullest device and the last stage) under each cost convention:

* ``fused``: the loss as one fused bf16 kernel, every GEMM at the preset's rate (the model before);
* ``fp32``: the loss op by op in fp32 as Megatron-LM runs it (:func:`pipeline.costs._cross_entropy`),
  GEMMs at their shape efficiency (:meth:`pipeline.hardware.GPUSpec.gemm_efficiency`): the model now;
* ``row``: what ``benchmarks.published`` predicts for a row of such a table (:func:`vocab_table_row`,
  measured MFU and memory instead of a throughput): the whole-job model at the A100 source's fitted
  compute scale, FlashAttention as the row does not say otherwise
  (:func:`experiments.benchmarks.published_job.predict_job`); its peak in GiB.

  python -m experiments.benchmarks.head_heavy [--gpu a100] [--json]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from typing import Any

from experiments.benchmarks.published_job import predict_job
from pipeline.arch import Architecture, LayerSpec
from pipeline.costs import CostOptions, runtime_cost_options
from pipeline.errors import ConfigError
from pipeline.hardware import GPUSpec, get_gpu
from pipeline.parallelism import Parallelism, estimate_job, job_cluster, job_profile, megatron_job_plan
from pipeline.runtime import RUNTIMES
from pipeline.spec import TrainingConfig

__all__ = ["head_heavy_row", "vocab_table_row", "main"]


def head_heavy_row(vocab: int, seq_len: int, *, gpu: GPUSpec, options: CostOptions, hidden: int = 3072,
                   layers: int = 32, heads: int = 24, pp: int = 8, microbatches: int = 128) -> dict[str, float]:
    """MFU and peak memory (GiB) of one synthetic row."""
    specs = (LayerSpec("embedding"),) + (LayerSpec(),) * layers + (LayerSpec("head"),)
    arch = Architecture("gpt", "gpt", hidden, vocab, specs, num_attention_heads=heads, num_key_value_heads=heads,
                        intermediate_size=4 * hidden, gated_mlp=False, seq_len=seq_len)
    par = Parallelism(pp=pp, microbatch_size=1, global_batch=microbatches)
    profile = job_profile(arch, par, gpu=gpu, seq_len=seq_len, options=options)
    cluster = job_cluster(par, gpu=gpu)
    training = TrainingConfig(runtime=RUNTIMES["megatron"])
    plan = megatron_job_plan(profile, cluster, par, training=training, chunks=[1])
    est = estimate_job(profile, cluster, plan, par=par, training=training, gpu=gpu, seq_len=seq_len)
    peaks = [x / 2**30 for x in est.result.peak_memory]
    return {"mfu": est.mfu, "peak_gib": max(peaks), "last_stage_gib": peaks[-1]}


def vocab_table_row(vocab: int, seq_len: int, *, mfu: float | None = None, peak_memory_gb: float | None = None,
                    flags: dict[str, Any] | None = None) -> dict[str, Any]:
    """The table's row for ``vocab`` and ``seq_len`` in the shared published format (its measured MFU and
    peak memory where given), as :mod:`experiments.benchmarks.published` reads it."""
    return {"id": f"head_heavy_{vocab // 1000}k_s{seq_len}", "table": "head-heavy vocabulary table",
            "model": {"name": "GPT h3072 L32", "layers": 32, "hidden": 3072, "ffn_hidden": None, "heads": 24,
                      "kv_heads": None, "vocab": vocab, "seq_len": seq_len},
            "parallel": {"tp": 1, "pp": 8, "dp": 1, "cp": 1, "vpp": 1},
            "batch": {"micro_batch_size": 1, "num_microbatches": 128, "global_batch": 128},
            "schedule": "1F1B", "gpus": 8, "gpu_type": "A100 SXM 80GB", "training_flags": flags or {},
            "measured": {"throughput": None, "throughput_unit": None, "mfu": mfu, "peak_memory_gb": peak_memory_gb}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", default="a100",
                        help="GPU preset of the fused and fp32 columns (default a100; the row column: the A100 table)")
    parser.add_argument("--json", action="store_true", help="one JSON object per row")
    args = parser.parse_args(argv)
    try:
        gpu = get_gpu(args.gpu)
    except ConfigError as exc:
        parser.error(str(exc))
    models = {"fused": (replace(gpu, sm_count=0), CostOptions(fused_cross_entropy=True, main_grad_bytes=0)),
              "fp32": (gpu, runtime_cost_options("megatron"))}
    if not args.json:
        print(f"{'vocab':>7} {'seq':>5}  {'MFU fused':>9} {'MFU fp32':>8} {'MFU row':>7}  {'peak fused':>10} "
              f"{'peak fp32':>9} {'peak row':>8}  {'last fused':>10} {'last fp32':>9}")
    for vocab in (32000, 64000, 128000, 256000):
        for seq_len in (2048, 4096):
            got = {k: head_heavy_row(vocab, seq_len, gpu=g, options=o) for k, (g, o) in models.items()}
            row = predict_job(vocab_table_row(vocab, seq_len), default_flash=True)
            got["row"] = {"mfu": row.mfu or 0.0, "peak_gib": row.peak_memory_gib or 0.0}
            if args.json:
                print(json.dumps({"vocab": vocab, "seq_len": seq_len, **{f"{k}_{f}": round(v, 4) for k, r in got.items()
                                                                       for f, v in r.items()}}))
                continue
            a, b, c = got["fused"], got["fp32"], got["row"]
            print(f"{vocab:>7} {seq_len:>5}  {a['mfu']:>9.3f} {b['mfu']:>8.3f} {c['mfu']:>7.3f}  "
                  f"{a['peak_gib']:>10.1f} {b['peak_gib']:>9.1f} {c['peak_gib']:>8.1f}  "
                  f"{a['last_stage_gib']:>10.1f} {b['last_stage_gib']:>9.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
