"""Child processes a reader streams from (``dcgmi dmon``, ``nvidia-smi -lms``) die with it.

A healthy streaming child dies of a broken pipe at its next line once its reader's process is
gone; one stuck in the driver (a wedged GPU or host engine: the case that matters) never
writes again and would live on under pid 1. So on Linux each is started through a tiny
wrapper that asks the kernel for ``SIGKILL`` when its parent dies (``prctl(PR_SET_PDEATHSIG)``,
kept across ``exec``), checks that the parent did not die before it asked, then execs the
command; without a Python to run the wrapper, ``preexec_fn`` does the same ``prctl`` (less
safe beside threads, so the wrapper comes first).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

#: ``prctl`` option: the signal this process gets when its parent dies (linux/prctl.h).
PR_SET_PDEATHSIG = 1
#: Run as ``python -I -S -c WRAPPER <parent pid> <command> <args...>``: ask for SIGKILL at the
#: parent's death, make sure the parent did not die before we asked, then become the command.
WRAPPER = (
    "import ctypes,os,signal,sys\n"
    "if ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0) != 0:\n"
    "    sys.stderr.write('prctl(PR_SET_PDEATHSIG) failed\\n')\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(0)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def dying_with_us(command: list[str]) -> tuple[list[str], Callable[[], None] | None]:
    """``(argv, preexec_fn)`` for :class:`subprocess.Popen` that start ``command`` so that it
    is killed when this process dies (Linux; elsewhere ``command`` as it is)."""
    if not sys.platform.startswith("linux"):
        return command, None
    python = sys.executable
    if python and os.access(python, os.X_OK) and os.path.basename(python).startswith("python"):
        return [python, "-I", "-S", "-c", WRAPPER, str(os.getpid()), *command], None
    return command, _die_with_parent()


def _die_with_parent() -> Callable[[], None] | None:
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)

    return preexec


__all__ = ["PR_SET_PDEATHSIG", "WRAPPER", "dying_with_us"]
