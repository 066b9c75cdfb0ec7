"""How a plan's compute-only order becomes each rank's program of computations and transfers.

PyTorch's ``_PipelineScheduleRuntime`` lowers the order in ``_add_send_recv`` (torch 2.13): a
round-robin over the ranks appends each computation with its SEND to the sender's program and the
matching RECV to the receiver's program at that moment. At run time a RECV posts its ``irecv``
where it stands and the consuming F/I/B waits on it; with gloo the data only moves once the
``irecv`` is posted, so a RECV that the lock-step puts just before its consumer leaves the whole
transfer on the critical path, which the performance model (transfers overlap compute) does not
charge.

``early`` (the executor's default) posts every RECV of a rank at the start of its program, in the
order PyTorch put them: the receive buffers of every micro-batch are allocated when the stage is
set up, so posting early costs no memory, and keeping each rank's RECVs in their relative order
keeps them matched with the sender's sends (same peers, same order). Sends stay ``isend``s waited
at the end of the step. ``torch`` keeps PyTorch's lowering as it is (torchtitan runs it).
"""

from __future__ import annotations

from typing import Any

__all__ = ["LOWERINGS", "post_receives_early", "lower"]

LOWERINGS = ("early", "torch")


def _is_recv(action: Any) -> bool:
    return action is not None and getattr(action.computation_type, "name", "") in ("RECV_F", "RECV_B")


def post_receives_early(program: dict[int, list[Any]]) -> dict[int, list[Any]]:
    """Each rank's RECVs first (in their order), then the rest of its program (in its order)."""
    return {rank: [a for a in acts if _is_recv(a)] + [a for a in acts if not _is_recv(a)]
            for rank, acts in program.items()}


def lower(schedule: Any, lowering: str) -> None:
    """Apply ``lowering`` to a loaded ``_PipelineScheduleRuntime`` (in place)."""
    if lowering not in LOWERINGS:
        raise ValueError(f"unknown lowering {lowering!r}; use one of {', '.join(LOWERINGS)}")
    if lowering == "early":
        schedule.pipeline_order_with_comms = post_receives_early(schedule.pipeline_order_with_comms)
