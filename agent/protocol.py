"""The agent's side of the restart protocol, pure functions (docs/design.md section 3): the view of
its GangJob it reacts to, which epoch to arrive at, whether the barrier is open, how to read
and write its pod's annotations, and the reconnect backoff. No I/O here.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from api.constants import (
    ANNOTATION_EPOCH,
    ANNOTATION_EXIT,
    ENV_EPOCH,
    ENV_PET_NNODES,
    ENV_PET_NODE_RANK,
    ENV_RANK,
    ENV_WORLD_SIZE,
)

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


def rendezvous_id(job_name: str, epoch: int) -> str:
    """torchrun's rendezvous id (`PET_RDZV_ID`) for a run at `epoch`: its static rendezvous
    prefixes every store key with it, so workers of different epochs never meet in one group."""
    return f"{job_name}-epoch-{epoch}"


@dataclass(frozen=True)
class JobState:
    """What the agent reads of its GangJob: `status.epoch`, `status.barrierEpoch`, `phase`, and
    the roles whose every worker succeeded (`status.roles[].state` `Complete`)."""

    epoch: int = 0
    barrier_epoch: int | None = None
    phase: str | None = None
    resource_version: str = ""
    complete_roles: frozenset[str] = frozenset()
    """Roles done for good: their workers are no part of any later restart."""
    world_size: int | None = None
    """`status.worldSize`: the `WORLD_SIZE` of `epoch` (None from a controller that does not
    write it: the pod's own environment stands)."""
    dropped: frozenset[int] = frozenset()
    """`status.dropped`: the workers an elastic gang goes on without at `epoch`."""
    places: tuple[tuple[int, int], ...] = ()
    """`status.places`: (worker, place) of the workers ranked in another's place at `epoch`
    (a spare holding a lost worker's rank)."""

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> JobState:
        """From a GangJob dict; a missing or malformed field reads as its default, because the
        controller may not have written a status yet."""
        status = obj.get("status")
        if not isinstance(status, dict):
            status = {}
        meta = obj.get("metadata")
        rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
        phase = status.get("phase")
        roles = status.get("roles")
        dropped = status.get("dropped")
        places = status.get("places")
        complete = frozenset(
            r["name"]
            for r in (roles if isinstance(roles, list) else [])
            if isinstance(r, dict)
            and r.get("state") == "Complete"
            and isinstance(r.get("name"), str)
        )
        return cls(
            epoch=_int(status.get("epoch")) or 0,
            barrier_epoch=_int(status.get("barrierEpoch")),
            phase=phase if isinstance(phase, str) else None,
            resource_version=rv if isinstance(rv, str) else "",
            complete_roles=complete,
            world_size=_int(status.get("worldSize")),
            dropped=frozenset(
                d for d in (dropped if isinstance(dropped, list) else []) if _int(d) is not None
            ),
            places=tuple(
                sorted(
                    (w, at)
                    for entry in (places if isinstance(places, list) else [])
                    if isinstance(entry, dict)
                    and (w := _int(entry.get("worker"))) is not None
                    and (at := _int(entry.get("place"))) is not None
                )
            ),
        )

    @property
    def finished(self) -> bool:
        return self.phase in TERMINAL_PHASES


def _int(value: Any) -> int | None:
    # bool is an int in Python, and never a valid epoch.
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def dense_rank(
    worker: int | None, dropped: frozenset[int], places: tuple[tuple[int, int], ...] = ()
) -> int | None:
    """The `RANK` of worker number `worker` at an epoch that goes on without `dropped`: its
    position among the epoch's workers ordered by place, then number, so that ranks stay dense
    (docs/design.md section 3.12). A worker's place is its number, unless `places` gives it
    another's (a spare holding a lost worker's rank): without `places`, its number less the
    dropped workers below it. None for a dropped worker, or without a number.

    O(dropped + places), not O(world): every agent computes its own at every epoch."""
    if worker is None or worker in dropped:
        return None
    moved = {w: at for w, at in places if w not in dropped and w != at}
    key = (moved.get(worker, worker), worker)
    # Workers at their own number n come first while (n, n) < key: every n below the place,
    # and the place itself when a worker of a higher number holds it (ties go by number).
    limit = key[0] + 1 if key[0] < worker else key[0]
    own = limit - sum(1 for d in dropped if d < limit) - sum(1 for w in moved if w < limit)
    return own + sum(1 for w, at in moved.items() if (at, w) < key)


def in_world(worker: int | None, state: JobState) -> bool:
    """Whether worker number `worker` runs at `state`'s epoch: not one the gang goes on
    without, nor a surplus worker of a shrink (its rank at or above the new size), whose pod is
    about to be deleted. Without a number or a world (a gang that is not elastic): yes."""
    if worker is None or state.world_size is None:
        return True
    rank = dense_rank(worker, state.dropped, state.places)
    return rank is not None and rank < state.world_size


def epoch_env(epoch: int, rank: int | None, world_size: int | None) -> dict[str, str]:
    """What the trainer started at `epoch` is told of its place in that epoch's world: the
    epoch, and with a known world its `RANK`, `WORLD_SIZE` and torchrun's `PET_NODE_RANK`,
    `PET_NNODES` (a pod is one torchrun node). The same lines go to `$GANGJOB_DIR/world` for a
    trainer the kubelet starts."""
    env = {ENV_EPOCH: str(epoch)}
    if rank is not None and world_size is not None:
        env |= {
            ENV_RANK: str(rank),
            ENV_WORLD_SIZE: str(world_size),
            ENV_PET_NODE_RANK: str(rank),
            ENV_PET_NNODES: str(world_size),
        }
    return env


def outside_world_env(epoch: int) -> dict[str, str]:
    """What the `world` file of a worker outside the world of `epoch` says (a spare, or a
    surplus worker whose pod is about to be deleted): the epoch, and no `RANK`. Its launcher,
    reading it, starts no trainer (`outside_world`)."""
    return epoch_env(epoch, None, None)


def outside_world(world: dict[str, str], epoch: int) -> bool:
    """Whether the `world` file read for `epoch` puts its worker outside that epoch's world:
    written for this very epoch, with no `RANK` (`outside_world_env`). Another epoch's file,
    or none (a gang that is not elastic), says nothing of it."""
    return world.get(ENV_EPOCH) == str(epoch) and ENV_RANK not in world


def world_file_text(env: dict[str, str]) -> str:
    """`$GANGJOB_DIR/world`: `NAME=value` lines, for a shell's `.` and for `read_world_file`."""
    return "".join(f"{name}={value}\n" for name, value in sorted(env.items()))


def read_world_file(text: str) -> dict[str, str]:
    """The variables of a `world` file; lines that are not `NAME=value` are skipped."""
    env: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip():
            env[name.strip()] = value.strip()
    return env


def target_epoch(arrived: int | None, epoch: int) -> int | None:
    """The epoch a (re)starting worker arrives at, or None: wait for `status.epoch > arrived`.

    `arrived` is its pod's `gangjob.io/epoch`, `epoch` the job's `status.epoch`. A pod that never
    arrived, or arrived below the gang, joins the gang's epoch. A pod already arrived at (or, if
    something went wrong, above) the gang's epoch has just failed there — its pod restarted under
    it — and must not rejoin a gang that is already running: it waits for the next epoch.
    """
    if arrived is None or arrived < epoch:
        return epoch
    return None


class Barrier(StrEnum):
    """Where a worker arrived at epoch T stands."""

    WAIT = "wait"
    OPEN = "open"
    MOVED = "moved"
    """The gang moved past T (`status.epoch > T`): stop, and arrive at the new epoch."""


def barrier(state: JobState, target: int) -> Barrier:
    if state.epoch > target:
        return Barrier.MOVED
    if state.barrier_epoch == target:
        return Barrier.OPEN
    return Barrier.WAIT


def arrived_epoch(pod: dict[str, Any]) -> int | None:
    """The pod's `gangjob.io/epoch` annotation; None when absent or not an epoch."""
    meta = pod.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    value = annotations.get(ANNOTATION_EPOCH) if isinstance(annotations, dict) else None
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def arrival_patch(epoch: int, exit: tuple[int, int] | None = None, uid: str = "") -> dict[str, Any]:
    """The merge-patch of a pod's annotations that arrives at `epoch` and, in the same write,
    reports a trainer exit as `<epoch>:<code>`. With the pod's `uid` the write is conditional
    on it (409 otherwise): an agent of a deleted pod must not annotate its namesake."""
    annotations = {ANNOTATION_EPOCH: str(epoch)}
    if exit is not None:
        annotations[ANNOTATION_EXIT] = f"{exit[0]}:{exit[1]}"
    meta: dict[str, Any] = {"annotations": annotations}
    if uid:
        meta["uid"] = uid
    return {"metadata": meta}


def exit_status(returncode: int) -> int:
    """A process's exit status as a shell reports it: killed by signal N -> 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


_JITTER = random.Random()


class Backoff:
    """Bounded exponential backoff with jitter, so a fleet of agents that lost the apiserver
    together does not come back in lockstep."""

    def __init__(
        self, initial: float = 0.2, maximum: float = 10.0, rng: random.Random | None = None
    ) -> None:
        self.initial = initial
        self.maximum = maximum
        self._failures = 0
        # One generator for the process, not one per backoff: seeding a `Random` reads 2.5 KB
        # from the kernel, and an agent makes a backoff per request it may retry.
        self._rng = rng or _JITTER

    def next(self) -> float:
        ceiling = min(self.maximum, self.initial * 2.0**self._failures)
        self._failures = min(self._failures + 1, 64)
        return self._rng.uniform(max(self.initial, ceiling / 2), ceiling)

    def reset(self) -> None:
        self._failures = 0
