"""Keeps the agent's view of its one GangJob current: read it, then watch it by name from that
resourceVersion (with bookmarks), read again on 410 or an ERROR event, and reconnect with backoff
on any failure, so an apiserver restart or a dropped stream is survived.

The read is a list filtered by name, not a GET of the object: a GET returns the object's own
resourceVersion, i.e. its last change, which the apiserver's watch cache forgets after a few
minutes of other writes; a watch from it then fails with 410 "too old resource version" however
often it is read again (seen on the sim cluster: object at 16, cache at 1164). The list's
resourceVersion is the current one, at the same cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable

from agent.apiclient import Api, ApiError, ClientError
from agent.config import Config
from agent.protocol import Backoff, JobState


def newest(a: JobState, b: JobState) -> JobState:
    """The later of two views of one job: `status.epoch` and `barrierEpoch` never go down, and
    a finished job stays finished, a complete role complete; the phase is that of the view with
    the higher epoch."""
    barrier = max((x for x in (a.barrier_epoch, b.barrier_epoch) if x is not None), default=None)
    if a.finished != b.finished:
        phase = a.phase if a.finished else b.phase
    else:
        phase = a.phase if a.epoch > b.epoch else b.phase
    # The world belongs to its epoch: the view of the later epoch says it.
    if a.epoch != b.epoch:
        later = a if a.epoch > b.epoch else b
        world, dropped, places = later.world_size, later.dropped, later.places
    elif b.world_size is not None:
        world, dropped, places = b.world_size, b.dropped, b.places
    else:
        world, dropped, places = a.world_size, a.dropped, a.places
    return JobState(
        epoch=max(a.epoch, b.epoch),
        barrier_epoch=barrier,
        phase=phase,
        resource_version=b.resource_version or a.resource_version,
        complete_roles=a.complete_roles | b.complete_roles,
        world_size=world,
        dropped=dropped,
        places=places,
    )


class JobWatcher:
    """The latest `JobState` of one GangJob, and waits on it. Run `run()` as a task."""

    def __init__(
        self, api: Api, config: Config, log: logging.LoggerAdapter[logging.Logger]
    ) -> None:
        self._api = api
        self._config = config
        self._log = log
        self.state: JobState | None = None
        self._changed = asyncio.Event()
        self._backoff = Backoff(config.backoff_initial, config.backoff_max)
        self._fresh = False
        """The resourceVersion watched from comes from a read, and no event came since."""
        self.deleted = False
        """The job is gone (a DELETED event, or a read found no such job): nothing more will
        come, and the watch has ended for good."""

    async def wait_for(self, predicate: Callable[[JobState], bool]) -> JobState:
        """The first state (the current one included) for which `predicate` holds."""
        while True:
            state = self.state
            if state is not None and predicate(state):
                return state
            changed = self._changed
            await changed.wait()

    def offer(self, state: JobState) -> None:
        """A state of the job learned elsewhere (the controller's arrival stream)."""
        self._publish(state)

    def _publish(self, state: JobState) -> None:
        previous = self.state
        if previous is not None:
            # Two sources (this watch and the controller's stream) may each lag the other:
            # epochs only go up, so the newest of both is the truth.
            state = newest(previous, state)
        self.state = state
        if previous is None or (
            state.epoch,
            state.barrier_epoch,
            state.phase,
            state.complete_roles,
        ) != (previous.epoch, previous.barrier_epoch, previous.phase, previous.complete_roles):
            # Wake every waiter, and give later waiters a fresh event to wait on.
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()

    async def read(self) -> JobState:
        """Reads the job once (no watch) and returns the newest state known: what a new pod
        reporting directly needs before its first report, whose answer then streams the rest."""
        await self._read()
        assert self.state is not None
        return self.state

    async def gone(self) -> bool:
        """Reads the job once: whether it no longer exists (False if it does, or if the read
        failed: only the apiserver's own answer says a job is gone)."""
        try:
            await self._read()
        except ApiError as e:
            if e.status == 404:
                self.deleted = True
                return True
        except ClientError:
            pass
        return False

    async def run(self) -> None:
        """Until the job is deleted: then the pod is garbage, collected soon, and an agent that
        went on reading would cost the apiserver a request per worker every backoff period
        (at N=5000, hundreds a second for as long as the collection takes)."""
        resource_version: str | None = None
        while not self.deleted:
            try:
                if resource_version is None:
                    resource_version = await self._read()
                    self._fresh = True
                resource_version = await self._watch(resource_version)
                continue  # the server ended the watch (timeoutSeconds), or the job is gone
            except ApiError as e:
                if e.status == 404:
                    self._log.warning(
                        "gangjob %s not found: no longer watching it", self._config.job_name
                    )
                    self.deleted = True
                    return
                if e.gone and not self._fresh:
                    self._log.info("watch: resourceVersion expired, reading the job again")
                    resource_version = None
                    continue
                failure: ClientError = e  # a 410 right after a read must not spin: back off
            except ClientError as e:
                failure = e
            delay = self._backoff.next()
            self._log.warning("watch of gangjob failed (%s); retrying in %.1fs", failure, delay)
            resource_version = None if isinstance(failure, ApiError) else resource_version
            await asyncio.sleep(delay)

    async def _read(self) -> str:
        """Reads the job, publishes its state; returns the resourceVersion to watch from."""
        config = self._config
        listed = await self._api.get(
            config.jobs_path, {"fieldSelector": f"metadata.name={config.job_name}"}
        )
        items = listed.get("items")
        if not isinstance(items, list) or not items or not isinstance(items[0], dict):
            raise ApiError(404, "NotFound", f"gangjob {config.job_name} not found")
        self._publish(JobState.from_object(items[0]))
        meta = listed.get("metadata")
        rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
        return rv if isinstance(rv, str) else ""

    async def _watch(self, resource_version: str) -> str | None:
        """One watch from `resource_version`; returns where to resume (None: GET again)."""
        config = self._config
        timeout = config.watch_timeout_seconds
        params = {
            "fieldSelector": f"metadata.name={config.job_name}",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout + random.randrange(timeout + 1)),
        }
        if resource_version:
            params["resourceVersion"] = resource_version
        stream = self._api.watch(
            config.jobs_path, params, inactivity_timeout=config.watch_inactivity_seconds
        )
        async with contextlib.aclosing(stream):
            async for event in stream:
                kind = event["type"]
                obj = event["object"]
                if kind == "ERROR":
                    code = obj.get("code")
                    if code == 410:
                        raise ApiError(410, "Expired", str(obj.get("message", "")))
                    raise ApiError(
                        code if isinstance(code, int) else 500,
                        str(obj.get("reason", "")),
                        str(obj.get("message", "watch ERROR event")),
                    )
                self._backoff.reset()
                self._fresh = False
                state = JobState.from_object(obj)
                if state.resource_version:
                    resource_version = state.resource_version
                if kind == "DELETED":
                    self._log.warning("gangjob %s was deleted", config.job_name)
                    self.deleted = True
                    return None
                if kind in ("ADDED", "MODIFIED"):
                    self._publish(state)
        self._backoff.reset()
        return resource_version
