"""`agent.pyz launch -- CMD ARGS...`: the trainer's process in `Pod` and `Recreate` modes with
`spec.nprocPerNode` (torchrun). Runs CMD with the epoch's rendezvous id and passes SIGTERM and
SIGINT on to it. A CMD that fails ends the container with its code, as without the launcher; one
that exits 0 is written to `$GANGJOB_DIR/trainer-exit` for the sidecar to report, and the
container keeps running until the sidecar writes `$GANGJOB_DIR/finished`: until the job has
finished, a worker that succeeded is one of the gang, and a restart (another worker failed)
restarts its pod in place with the others (docs/design.md section 3.2).

A worker outside the world of its epoch (an elastic gang's spare, or a surplus worker whose pod
is about to be deleted: its `$GANGJOB_DIR/world` names the epoch and no `RANK`) starts no
command: `hold` keeps the container up, running nothing, until the kubelet stops it (the gang
moves on and the pod restarts in place, or the pod is deleted) or the job finishes (section
3.12).

Standard library only: it ships in the agent's zipapp.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType

from api.constants import EPOCH_FILE, FINISHED_FILE, LAUNCH_POLL_SECONDS, TRAINER_EXIT_FILE

NOT_EXECUTABLE_EXIT_CODE = 126
NOT_FOUND_EXIT_CODE = 127
"""As a shell reports a command it cannot run, or cannot find."""


def exit_code(returncode: int) -> int:
    """A child's `returncode` as a shell reports it: a death by signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def launch(command: Sequence[str], env: Mapping[str, str], directory: Path, epoch: int) -> int:
    """Runs `command` to its end; returns the container's exit code."""
    try:
        child = subprocess.Popen(list(command), env=dict(env))
    except OSError as e:
        print(f"agent: error: launch: {command[0]}: {e}", file=sys.stderr)
        return NOT_FOUND_EXIT_CODE if isinstance(e, FileNotFoundError) else NOT_EXECUTABLE_EXIT_CODE

    def forward(signum: int, _frame: FrameType | None) -> None:
        child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    code = exit_code(child.wait())
    if code != 0:
        return code
    (directory / TRAINER_EXIT_FILE).write_text(f"{epoch}:0\n")
    _hold(directory, lambda: False, "")
    return 0


def hold(directory: Path, epoch: int) -> bool:
    """Outside the world of `epoch`: runs nothing until the kubelet stops the container or the
    job finishes (True: exit 0, nothing failed), or the epoch file names a later epoch (False:
    launch again, for that epoch). The latter only happens if the sidecar restarted on its own
    and arrived at a later epoch without the pod restarting: normally a new epoch restarts the
    whole pod, this container included."""

    def moved() -> bool:
        try:
            return int((directory / EPOCH_FILE).read_text().strip()) > epoch
        except (OSError, ValueError):
            return False  # being replaced: the sidecar writes it whole, by a rename

    said = f"agent: launch: outside the world of epoch {epoch} (a spare): no trainer started"
    return _hold(directory, moved, said)


def _hold(directory: Path, moved: Callable[[], bool], said: str) -> bool:
    """Holds the container until the job finishes or a signal comes (True), or `moved()`;
    says `said` on stderr once it holds."""
    # The kubelet's SIGTERM (the gang restarts, or the pod is deleted) ends the wait at once:
    # as the container's PID 1 the launcher would otherwise ignore it until the SIGKILL.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _leave)
    try:
        if said:
            print(said, file=sys.stderr, flush=True)
        while not (directory / FINISHED_FILE).exists():
            if moved():
                return False
            time.sleep(LAUNCH_POLL_SECONDS)
    except _Leave:
        pass
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
    return True


class _Leave(Exception):
    """A signal while the container is held: it ends, with the trainer's success."""


def _leave(_signum: int, _frame: FrameType | None) -> None:
    raise _Leave
