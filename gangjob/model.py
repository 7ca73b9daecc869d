"""The typed results of the client: a `Job` (what `submit`, `get`, `wait`, `list` return) with
the fields people look at first, and the whole resource as the API models of `api.v1alpha1`.
Pure: a GangJob dict in."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from api.v1alpha1 import GangJob, RestartRecord, parse_gangjob

TERMINAL = ("Succeeded", "Failed")
"""The phases of a job that has ended."""


@dataclass(frozen=True)
class Job:
    """One GangJob as last read from the API."""

    name: str
    namespace: str
    phase: str
    """Pending until the controller has written a status; then the status' phase."""
    epoch: int
    restarts: int
    """Gang restarts so far (epoch bumps)."""
    workers_ready: int
    workers: int
    """The gang's size: `spec.replicas`, or the roles' replicas added up."""
    step: int | None
    """The gang's training step, when its trainers report progress."""
    goodput: float | None
    """Productive time / wall time (0..1), when its trainers report progress."""
    history: list[RestartRecord] = field(repr=False)
    """Every restart, oldest first (the one in progress last)."""
    resource: GangJob = field(repr=False)
    """The whole object, typed (spec and status)."""
    raw: Mapping[str, Any] = field(repr=False)
    """The object as the API returned it (camelCase)."""

    @property
    def finished(self) -> bool:
        return self.phase in TERMINAL

    @property
    def succeeded(self) -> bool:
        return self.phase == "Succeeded"

    @classmethod
    def from_api(cls, obj: Mapping[str, Any]) -> Job:
        job = parse_gangjob(obj)
        st = job.status
        history = list(st.history)
        last = st.last_restart
        if last is not None and not any(r.epoch == last.epoch for r in history):
            history.append(last)
        replicas = job.spec.replicas
        if replicas is None:
            replicas = sum(role.replicas for role in job.spec.roles or [])
        return cls(
            name=job.metadata.name,
            namespace=job.metadata.namespace,
            phase=str(st.phase or "Pending"),
            epoch=st.epoch,
            restarts=st.restarts.total,
            workers_ready=st.workers.ready,
            workers=replicas,
            step=st.progress.step if st.progress else None,
            goodput=st.goodput.ratio if st.goodput else None,
            history=history,
            resource=job,
            raw=obj,
        )
