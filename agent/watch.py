"""Keeps the agent's view of its one GangJob current: GET, then watch it by name from that
resourceVersion (with bookmarks), re-GET on 410 or an ERROR event, and reconnect with backoff on
any failure, so an apiserver restart or a dropped stream is survived."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable

from agent.apiclient import Api, ApiError, ClientError
from agent.config import Config
from agent.protocol import Backoff, JobState


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

    async def wait_for(self, predicate: Callable[[JobState], bool]) -> JobState:
        """The first state (the current one included) for which `predicate` holds."""
        while True:
            state = self.state
            if state is not None and predicate(state):
                return state
            changed = self._changed
            await changed.wait()

    def _publish(self, state: JobState) -> None:
        previous, self.state = self.state, state
        if previous is None or (state.epoch, state.barrier_epoch, state.phase) != (
            previous.epoch,
            previous.barrier_epoch,
            previous.phase,
        ):
            # Wake every waiter, and give later waiters a fresh event to wait on.
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()

    async def run(self) -> None:
        config = self._config
        resource_version: str | None = None
        while True:
            try:
                if resource_version is None:
                    obj = await self._api.get(config.job_path)
                    state = JobState.from_object(obj)
                    self._publish(state)
                    resource_version = state.resource_version
                resource_version = await self._watch(resource_version)
                continue  # the server ended the watch (timeoutSeconds): resume at once
            except ApiError as e:
                if e.gone:
                    self._log.info("watch: resourceVersion expired, reading the job again")
                    resource_version = None
                    continue
                failure: ClientError = e
            except ClientError as e:
                failure = e
            delay = self._backoff.next()
            self._log.warning("watch of gangjob failed (%s); retrying in %.1fs", failure, delay)
            resource_version = None if isinstance(failure, ApiError) else resource_version
            await asyncio.sleep(delay)

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
                state = JobState.from_object(obj)
                if state.resource_version:
                    resource_version = state.resource_version
                if kind == "DELETED":
                    self._log.warning("gangjob %s was deleted", config.job_name)
                    return None
                if kind in ("ADDED", "MODIFIED"):
                    self._publish(state)
        self._backoff.reset()
        return resource_version
