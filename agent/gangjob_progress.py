"""GangJob's progress helper for trainers (docs/progress.md): report training steps to the agent,
and let it ask for the trainer's stacks when it stops progressing.

    import gangjob_progress

    for step in range(start, steps):
        ...
        gangjob_progress.step(step, compute=seconds, checkpoint=last_saved)

The agent writes this file into `$GANGJOB_DIR/python` and puts that directory on the trainer's
`PYTHONPATH`; it ships inside the agent's zipapp. It stands alone (the standard library only,
nothing of GangJob's packages), so its two protocol names are spelled here as well as in
api/constants.py; tests/unit/test_progress_helper.py pins them equal.

Outside a GangJob (`GANGJOB_PROGRESS` unset) every call does nothing, so a trainer can call it
unconditionally.
"""

from __future__ import annotations

import faulthandler
import math
import os
import signal
import sys
from typing import IO

ENV_PROGRESS = "GANGJOB_PROGRESS"
STACKS_PREFIX = "stacks."
"""api.constants.STACKS_PREFIX"""
STACKS_SIGNAL = "SIGUSR1"
"""api.constants.STACKS_SIGNAL"""

_stacks: IO[str] | None = None
_stacks_pid = 0


def path() -> str | None:
    """The file this process writes: `$GANGJOB_PROGRESS`, or under torchrun (`LOCAL_RANK` set)
    `$GANGJOB_PROGRESS.<LOCAL_RANK>`, one file per local process. None outside a GangJob."""
    base = os.environ.get(ENV_PROGRESS, "").strip()
    if not base:
        return None
    local = os.environ.get("LOCAL_RANK", "").strip()
    return f"{base}.{local}" if local.isdigit() else base


def line(step: int, compute: float | None = None, checkpoint: int | None = None) -> str:
    """The progress line for `step` (newline included); ValueError for values the agent would
    count as malformed."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step={step!r}: a non-negative integer is required")
    text = f"step={step}"
    if compute is not None:
        if not math.isfinite(compute) or compute < 0:
            raise ValueError(f"compute={compute!r}: non-negative seconds are required")
        text += f" compute={compute:.6g}"
    if checkpoint is not None:
        if isinstance(checkpoint, bool) or not isinstance(checkpoint, int) or checkpoint < 0:
            raise ValueError(f"checkpoint={checkpoint!r}: a non-negative integer is required")
        text += f" checkpoint={checkpoint}"
    return text + "\n"


def step(step: int, compute: float | None = None, checkpoint: int | None = None) -> None:
    """Reports that this process reached `step`; `compute`: its own compute time in that step
    (seconds, without waiting for other ranks); `checkpoint`: the latest step durably saved.

    The file is replaced whole (a temporary file renamed over it), so the agent never reads half
    a line. The first call also registers the stack dump (`register_stacks`)."""
    target = path()
    if target is None:
        return
    text = line(step, compute, checkpoint)
    tmp = f"{os.path.dirname(target)}/.{os.path.basename(target)}.{os.getpid()}.tmp"
    try:
        register_stacks()
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, target)
    except OSError as e:
        # Progress is the agent's business, never a reason for training to fail.
        _warn_once(f"gangjob_progress: cannot write {target}: {e}")


_warned = False


def _warn_once(message: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        print(message, file=sys.stderr, flush=True)


def register_stacks() -> str | None:
    """Registers a dump of every thread's stack (`faulthandler`) on `STACKS_SIGNAL` into
    `stacks.<pid>` beside the progress file, whose first line names this process for the agent;
    returns that file's path. Once per process (again in a forked child)."""
    global _stacks, _stacks_pid
    target = path()
    if target is None:
        return None
    pid = os.getpid()
    name = f"{os.path.dirname(target)}/{STACKS_PREFIX}{pid}"
    if _stacks is not None and _stacks_pid == pid:
        return name
    stacks = open(name, "a")  # noqa: SIM115 - faulthandler writes to it for the process's life
    stacks.write(f"pid={pid} start={_start_time()}\n")
    stacks.flush()
    signum = getattr(signal, STACKS_SIGNAL)
    # A handler the trainer (or its framework) installed before still runs; the default action
    # (terminate) must not.
    chain = callable(signal.getsignal(signum))
    faulthandler.register(signum, file=stacks, all_threads=True, chain=chain)
    _stacks, _stacks_pid = stacks, pid
    return name


def _start_time() -> str:
    """This process's start time in clock ticks since boot (/proc/self/stat, field 22): with
    the pid it names the process, so that the agent never signals another that reused the pid
    or lives in another pid namespace. '0' where there is no /proc."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return "0"
    # "pid (comm) state ...": comm may hold spaces and parentheses; field 22 is the 20th after it.
    return stat[stat.rfind(b")") + 2 :].split()[19].decode()
