"""One prepared check of the performance model on a real GPU: every layer kind's F/B times and
activation bytes, and one plan's per-device peak memory, measured beside the analytic model's
prediction for the GPU's preset. Without CUDA (or with --tiny) it runs 32x narrower on the CPU in
seconds, which checks the check, not the model. Sized for under 8 minutes on one H200.

  python -m experiments gpu-check --out runs/gpu_check.json
  python -m experiments gpu-check --tiny --device cpu
"""

from __future__ import annotations

import argparse

from experiments.common import positive_int

NAME = "gpu-check"
HELP = "measure layer kinds and a plan's peak memory on a GPU beside the model's prediction"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The check's flags (torch-free, so building the command line does not import torch)."""
    parser.add_argument("--tiny", action="store_true", help="32x narrower, 64 tokens, fp32 (automatic without CUDA)")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--gpu", default=None, help="analytic preset to compare with (default: from the device name)")
    parser.add_argument("--seq-len", type=positive_int, default=None, help="tokens per sequence (4096; tiny 64)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed runs per layer (3; tiny 0)")
    parser.add_argument("--repeats", type=positive_int, default=None, help="timed runs per layer (10; tiny 1)")
    parser.add_argument("--models", default=None,
                        help="comma-separated sources of part (a)'s layer kinds: deepseek-small, gemma-small, "
                             "nemotronh-small, llama-control, hybrid (default: all)")
    parser.add_argument("--plan-model", default="gemma-small", help="zoo model of part (b)")
    parser.add_argument("--stages", type=int, choices=(2, 3, 4), default=4, help="stages (= devices) of part (b)")
    parser.add_argument("--microbatches", type=positive_int, default=8, help="micro-batches of part (b)")
    parser.add_argument("--skip-plan", action="store_true", help="part (a) only")
    parser.add_argument("--out", default="runs/gpu_check.json", help="write the JSON here")
    parser.add_argument("--json", action="store_true", help="print the JSON instead of the table")


def run(args: argparse.Namespace) -> int:
    from experiments.gpu_check import run as run_check

    return run_check(args)
