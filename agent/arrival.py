"""How a worker announces that it arrived at an epoch (and, in `Process` mode, how its trainer
exited). Behind the `Arrival` interface so that a cheaper channel than one pod write per worker
can replace the annotation (docs/design.md section 3.4)."""

from __future__ import annotations

from typing import Protocol

from agent.apiclient import Api
from agent.protocol import arrival_patch


class Arrival(Protocol):
    async def arrive(self, epoch: int, exit: tuple[int, int] | None = None) -> None:
        """Durably record that this worker arrived at `epoch`; with `exit=(epoch, code)` also
        that its trainer exited with `code` at that epoch, in the same write. Raises
        `ClientError` on failure (the caller retries)."""
        ...

    async def close(self) -> None:
        """The last report is no longer needed (the agent is ending)."""
        ...


class AnnotationArrival:
    """Arrival as a merge-patch of the agent's own pod: `gangjob.io/epoch: "<E>"` and
    `gangjob.io/exit: "<E>:<code>"`. One write, read by the controller's pod watch."""

    def __init__(self, api: Api, pod_path: str, pod_uid: str = "") -> None:
        self._api = api
        self._pod_path = pod_path
        self._pod_uid = pod_uid

    async def arrive(self, epoch: int, exit: tuple[int, int] | None = None) -> None:
        await self._api.merge_patch(self._pod_path, arrival_patch(epoch, exit, self._pod_uid))

    async def close(self) -> None:
        return None  # the annotation stays: it is the durable record
