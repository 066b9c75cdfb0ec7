"""Run a command that ends with the process that started it: ``python -m executor.orphan_guard PID CMD...``.

``run_torchrun`` starts torchrun in a session of its own (a terminal's Ctrl-C must reach it through
its parent, which stops it), so a parent killed outright (SIGKILL, the OOM killer) would leave the
job running. On Linux this sets the parent-death signal (``PR_SET_PDEATHSIG``) to SIGTERM and then
execs ``CMD`` in place: the setting survives the exec, and torchrun answers SIGTERM by stopping its
workers. ``PID`` is the parent that should be alive; if it is already gone (it died between the
fork and the ``prctl``) the command is not started. Elsewhere the command is exec'd as it is.

:func:`die_with_parent` is the same setting for a process of its own: ``executor.launch``'s ranks
take it under torchrun, so that a launcher killed outright (``run_torchrun``'s ``--timeout``, the
OOM killer) takes its ranks with it; torch's elastic agent starts them in sessions of their own,
out of reach of a signal to the launcher's process group.
"""

from __future__ import annotations

import os
import signal
import sys

#: ``prctl`` option that sets the signal a process gets when its parent thread exits (linux/prctl.h).
PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> bool:
    """Have this process get ``sig`` when the thread that started it exits (Linux ``PR_SET_PDEATHSIG``,
    kept across ``exec``); False where it cannot be set (another system, no ``prctl``)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig)) == 0
    except (OSError, AttributeError):  # no prctl: run unguarded rather than not at all
        return False


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not argv[0].isdigit():
        print("usage: python -m executor.orphan_guard PARENT_PID COMMAND [ARGS...]", file=sys.stderr)
        return 2
    parent, command = int(argv[0]), argv[1:]
    die_with_parent()
    if sys.platform.startswith("linux") and os.getppid() != parent:
        return 1  # the parent died before the guard was set: start nothing
    os.execvp(command[0], command)
    return 127  # not reached: execvp replaces this process or raises


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
