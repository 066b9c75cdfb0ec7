"""Check a ``megatron_args.txt`` with megatron-core's own layout parser, before a job.

``python -m experiments.megatron_check FILE`` reads the file line by line (``--flag`` alone,
``--flag value`` or ``--flag value value ...`` for Megatron's list arguments such as
``--recompute-modules``, values quoted for a shell, as ``search --target megatron`` and the whole-job
search write them), validates ``--pipeline-model-parallel-layout`` against ``--num-layers`` and
``--mtp-num-layers`` with megatron-core (a dev requirement; CPU only) and prints the layout per
rank. Exit 0 when Megatron accepts it, 2 with one line when not.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["check_megatron_args", "main", "read_megatron_args"]


def read_megatron_args(text: str) -> dict[str, str | None]:
    """``{flag: value}`` of a megatron_args.txt; a flag without a value maps to None, a list
    argument's values to one string joined by spaces."""
    out: dict[str, str | None] = {}
    for number, line in enumerate(text.splitlines(), 1):
        words = shlex.split(line)
        if not words:
            continue
        if not words[0].startswith("--") or any(w.startswith("--") for w in words[1:]):
            raise ValueError(f"line {number}: expected one '--flag' and its values, got {line!r}")
        out[words[0]] = " ".join(words[1:]) if len(words) > 1 else None
    return out


def check_megatron_args(text: str) -> str:
    """megatron-core's picture of the file's layout; raises ValueError when Megatron refuses it."""
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    args = read_megatron_args(text)
    for flag in ("--pipeline-model-parallel-layout", "--pipeline-model-parallel-size", "--num-layers"):
        if not args.get(flag):
            raise ValueError(f"{flag} is missing or has no value")
    mtp = args.get("--mtp-num-layers")
    layout = PipelineParallelLayerLayout(args["--pipeline-model-parallel-layout"],
                                         int(args["--pipeline-model-parallel-size"]))
    layout.validate_layer_layout(num_layers=int(args["--num-layers"]), mtp_num_layers=int(mtp) if mtp else None)
    return layout.pretty_repr()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1:
        print("usage: python -m experiments.megatron_check megatron_args.txt", file=sys.stderr)
        return 2
    try:
        print(check_megatron_args(Path(argv[0]).read_text()))
    except (OSError, ValueError, AssertionError) as exc:
        print(f"error: {argv[0]}: Megatron refuses it: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
