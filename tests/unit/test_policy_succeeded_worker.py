"""A worker whose trainer exited 0 when another fails afterwards (docs/design.md section 3.2):
until the job has succeeded it is one of the gang, so the restart runs it again at the new
epoch with everyone else, in place while its pod runs (its agent, or its launcher, holds the
container); only a pod the kubelet has ended is created again. Whatever the success policy:
`Rank0` and `Any` of a role end the job on their own worker's success, never on another's."""

from __future__ import annotations

from typing import Any

import pytest

from api.v1alpha1 import Phase, RestartMode
from controller.policy.plan import Plan, plan
from tests.unit.builders import with_status
from tests.unit.gangs import crashed, gang, observe, replan, running_status, worker
from tests.unit.test_policy_roles import roles_job


def _succeeded(rank: int) -> dict[str, Any]:
    """A worker whose trainer exited 0 at epoch 0, its pod still running: in `Process` mode the
    agent reported it and waits; in `Pod` mode the launcher wrote it, the sidecar reported it,
    and the launcher holds the trainer's container."""
    pod = worker(rank, 0)
    pod["metadata"]["annotations"]["gangjob.io/exit"] = "0:0"
    return pod


def _failed(rank: int, mode: RestartMode) -> dict[str, Any]:
    """A worker whose trainer exited 1 at epoch 0: its container (`Pod` mode), or as its agent
    reported, the agent running on (`Process` mode)."""
    if mode is RestartMode.POD:
        return crashed(worker(rank, 0), 1)
    pod = worker(rank, 0)
    pod["metadata"]["annotations"]["gangjob.io/exit"] = "0:1"
    return pod


def _restart_after_success(mode: RestartMode, **spec: Any) -> Plan:
    """Rank 1 succeeded, then rank 0 fails."""
    status = running_status().model_copy(update={"mode": mode})
    pods = [_failed(0, mode), _succeeded(1), worker(2, 0)]
    spec.setdefault("restart", {"mode": mode.value})
    observed = gang(3, status, pods, **spec)
    result = plan(observed)
    replan(observed, result)
    return result


@pytest.mark.parametrize("mode", [RestartMode.POD, RestartMode.PROCESS])
@pytest.mark.parametrize(
    "spec",
    [{}, {"successPolicy": "Rank0"}],
    ids=["All", "Rank0"],
)
def test_a_worker_that_succeeded_restarts_in_place_when_another_fails(
    mode: RestartMode, spec: dict[str, Any]
) -> None:
    result = _restart_after_success(mode, **spec)
    assert result.status.phase is Phase.RESTARTING
    assert result.status.epoch == 1
    last = result.status.last_restart
    assert last is not None
    assert (last.trigger.worker, last.trigger.failure_class) == (0, "ProcessExit")
    assert last.recreated == []
    assert result.delete_pods == []
    assert result.status.restarts.in_place == 1


def test_with_roles_any_a_worker_of_another_role_that_succeeded_restarts_in_place() -> None:
    # The job succeeds when its launcher does; a worker's success ends nothing.
    template = {"spec": {"containers": [{"name": "trainer", "image": "trainer:1"}]}}
    roles = [
        {"name": "launcher", "replicas": 1, "template": template},
        {"name": "worker", "replicas": 2, "template": template},
    ]
    status = running_status()
    pods = [crashed(_role_pod(0, "launcher", 0), 1), _role_pod(1, "worker", 0),
            _role_pod(2, "worker", 1)]  # fmt: skip
    pods[1]["metadata"]["annotations"]["gangjob.io/exit"] = "0:0"
    job = roles_job(roles, success={"operator": "Any", "roles": ["launcher"]})
    observed = observe(with_status(job, status), pods)
    result = plan(observed)
    assert result.status.phase is Phase.RESTARTING
    last = result.status.last_restart
    assert last is not None
    assert last.recreated == []
    assert result.delete_pods == []


def _role_pod(number: int, role: str, index: int) -> dict[str, Any]:
    pod = worker(number, 0, name=f"llama-{role}-{index}")
    labels = pod["metadata"]["labels"]
    labels["gangjob.io/role"], labels["gangjob.io/role-index"] = role, str(index)
    pod["metadata"]["uid"] = f"uid-{number}"
    return pod


def test_a_pod_the_kubelet_ended_after_its_trainer_succeeded_is_created_again() -> None:
    # Pod mode with the trainer run as the container's own process: once it exits 0 the kubelet
    # stops the sidecar and the pod is Succeeded. Nothing can restart it in place; the restart
    # runs the worker again in a new pod.
    pods = [crashed(worker(0, 0), 1), worker(1, 0, phase="Succeeded"), worker(2, 0)]
    result = plan(gang(3, running_status(), pods))
    last = result.status.last_restart
    assert last is not None
    assert last.recreated == [1]
    assert [d.name for d in result.delete_pods] == ["llama-1"]


def test_a_success_and_a_failure_seen_in_one_pass_under_rank0_end_the_job() -> None:
    # Rank 0's success decides: the job is over, a later failure of another rank restarts
    # nothing.
    pods = [_succeeded(0), crashed(worker(1, 0), 1), worker(2, 0)]
    result = plan(gang(3, running_status(), pods, successPolicy="Rank0"))
    assert result.status.phase is Phase.SUCCEEDED
    assert result.status.epoch == 0
