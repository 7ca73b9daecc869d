"""The simulated kubelet's own parts that need no cluster: how a status write merges into the
pod, the status manager's queue (one write at a time per pod, backoff on overload) against a
scripted apiserver, and `Process` mode's stand-in trainer. What the apiserver does with the
writes is tested against the real one (tests/integration/test_simkubelet.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, cast

import pytest

from agent.apiclient import ApiError, HttpClient, JsonDict
from localcluster.simkubelet import STOPPED_EXIT_CODE, SimTrainer, trainer_command
from localcluster.simstatus import StatusManager, merge_status


def test_a_write_replaces_the_kubelets_conditions_and_keeps_the_others() -> None:
    current = {
        "phase": "Running",
        "conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "DisruptionTarget", "status": "True"},
            {"type": "AllContainersRestarting", "status": "True"},
        ],
        "containerStatuses": [
            {"name": "trainer", "restartCount": 0, "allocatedResourcesStatus": [{"name": "gpu"}]}
        ],
    }
    kubelet = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "False"}],
        "containerStatuses": [{"name": "trainer", "restartCount": 1}],
    }
    merged = merge_status(current, kubelet)
    assert merged["conditions"] == [
        {"type": "DisruptionTarget", "status": "True"},
        {"type": "Ready", "status": "False"},
    ]
    assert merged["containerStatuses"] == [
        {"name": "trainer", "restartCount": 1, "allocatedResourcesStatus": [{"name": "gpu"}]}
    ]
    assert current["conditions"][0] == {"type": "Ready", "status": "True"}  # not changed


class ScriptedApi:
    """Pod `w` (uid `u`) of an apiserver that answers the status writes from a script of
    errors, then accepts them; records each accepted status and how many writes overlapped."""

    def __init__(self, errors: list[int]) -> None:
        self.errors = list(errors)
        self.pod: JsonDict = {"metadata": {"name": "w", "uid": "u", "resourceVersion": "1"}}
        self.written: list[JsonDict] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.gate = asyncio.Event()
        self.gate.set()
        self.entered = asyncio.Event()

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> JsonDict:
        return self.pod

    async def merge_patch(self, path: str, patch: JsonDict) -> JsonDict:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        self.entered.set()
        try:
            await self.gate.wait()
            if self.errors:
                raise ApiError(self.errors.pop(0))
            version = str(int(self.pod["metadata"]["resourceVersion"]) + 1)
            self.pod = {"metadata": {**self.pod["metadata"], "resourceVersion": version},
                        "status": patch["status"]}  # fmt: skip
            self.written.append(patch["status"])
            return self.pod
        finally:
            self.in_flight -= 1


def _manager(api: ScriptedApi) -> StatusManager:
    return StatusManager(
        cast(HttpClient, api), "/api/v1/namespaces/n/pods", lambda name: None,
        workers=4, backoff_initial=0.001, backoff_max=0.01,
    )  # fmt: skip


async def _drained(manager: StatusManager) -> None:
    async with asyncio.timeout(5):
        await manager.drained()


@pytest.mark.parametrize("code", [429, 500, 503])
async def test_overload_is_retried_until_the_write_lands(code: int) -> None:
    api = ScriptedApi([code, code])
    manager = _manager(api)
    marks: list[float] = []
    manager.set("w", "u", {"phase": "Running"}, marks.append)
    await _drained(manager)
    await manager.close()
    assert api.written == [{"phase": "Running"}]
    assert (manager.retries, manager.writes, len(marks)) == (2, 1, 1)


async def test_a_status_set_during_a_write_follows_it_and_never_overlaps() -> None:
    api = ScriptedApi([])
    api.gate.clear()
    manager = _manager(api)
    first: list[float] = []
    second: list[float] = []
    manager.set("w", "u", {"phase": "Pending"}, first.append)
    await api.entered.wait()  # the first write is on its way
    manager.set("w", "u", {"phase": "Running"}, second.append)
    manager.set("w", "u", {"phase": "Succeeded"})
    api.gate.set()
    await _drained(manager)
    await manager.close()
    # The one in flight lands; of the two queued behind it only the latest is sent.
    assert [s["phase"] for s in api.written] == ["Pending", "Succeeded"]
    assert api.most_in_flight == 1
    assert first[0] < second[0]


async def test_an_invalid_status_is_dropped_not_retried() -> None:
    api = ScriptedApi([422])
    manager = _manager(api)
    manager.set("w", "u", {"phase": "Bogus"})
    await _drained(manager)
    manager.set("w", "u", {"phase": "Running"})
    await _drained(manager)
    await manager.close()
    assert api.written == [{"phase": "Running"}]
    assert manager.retries == 0


async def test_the_stand_in_trainer_runs_until_it_exits_or_is_stopped() -> None:
    run = SimTrainer(["python3", "train.py"], {"GANGJOB_EPOCH": "2"})
    await run.start()
    assert (run.epoch, run.running, run.pid) == (2, True, None)
    waiter = asyncio.create_task(run.wait())
    await asyncio.sleep(0)
    waiter.cancel()  # the agent cancels its waits: the run goes on
    run.exit(7)
    assert await run.wait() == 7
    assert run.ended_at is not None
    assert await run.stop(1.0) == 7  # ended already: the code stays

    stopped = SimTrainer(["t"], {})
    assert await stopped.stop(1.0) == STOPPED_EXIT_CODE


def test_the_trainer_command_is_what_the_agent_wraps() -> None:
    def pod(command: list[str], **extra: Any) -> JsonDict:
        return {"spec": {"containers": [{"name": "trainer", "command": command, **extra}]}}

    wrapped = ["python3", "/gangjob/agent.pyz", "wrap", "--", "python3", "train.py"]
    assert trainer_command(pod(wrapped), "trainer") == ["python3", "train.py"]
    assert trainer_command(pod(["sh"], args=["-c", "x"]), "trainer") == ["sh", "-c", "x"]
    assert trainer_command(pod(["sh"]), "other") == []
