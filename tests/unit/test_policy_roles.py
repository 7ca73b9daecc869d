"""Roles, pure (issue 15): the shorthand normalised into one role, ranks and names per role, the
workers' environment, start order (`dependsOn` Ready and Complete), one restart and one barrier
across the running roles, per-role failure rules, `Ignore`, and the success policy by roles."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from pydantic import ValidationError

from api.builders import gangjob, role
from api.failures import FailureClass
from api.v1alpha1 import (
    FailureAction,
    GangJob,
    GangJobSpec,
    GangJobStatus,
    RoleState,
    parse_gangjob,
)
from controller.policy import classify
from controller.policy.classify import Failure
from controller.policy.plan import Observed, Plan, plan
from controller.policy.podspec import build_pod, worker_env
from controller.policy.success import job_succeeded
from controller.policy.views import PodView
from tests.unit.builders import JOB_NAME, JOB_UID, NAMESPACE, T0, TEMPLATE
from tests.unit.gangs import carry_out, observe

SIMPLE = {"spec": {"containers": [{"name": "trainer", "image": "t:1", "command": ["run"]}]}}


def roles_job(roles: list[dict[str, Any]], **spec: Any) -> GangJob:
    body = gangjob(JOB_NAME, None, namespace=NAMESPACE, spec={"roles": roles, **spec})
    body["metadata"].update(uid=JOB_UID, generation=1, creationTimestamp="2026-05-01T10:00:00Z")
    return parse_gangjob(body)


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    trainer = pod["spec"]["containers"][0]
    return {e["name"]: e["value"] for e in trainer["env"] if "value" in e}


def names(result: Plan) -> list[str]:
    return [p["metadata"]["name"] for p in result.create_pods]


def state(result: Plan) -> dict[str, RoleState]:
    return {r.name: r.state for r in result.status.roles or ()}


def running(observed: Observed, *names: str, epoch: int = 0, ready: bool = True) -> Observed:
    """The named pods Running, arrived at `epoch`, and Ready (if `ready`)."""
    pods = [
        dataclasses.replace(
            p, phase="Running", ready=ready, arrived_epoch=epoch, creation_timestamp=T0
        )
        if p.name in names
        else p
        for p in observed.pods
    ]
    return dataclasses.replace(observed, pods=pods)


def succeeded(observed: Observed, *names: str) -> Observed:
    pods = [
        dataclasses.replace(p, phase="Succeeded", ready=False) if p.name in names else p
        for p in observed.pods
    ]
    return dataclasses.replace(observed, pods=pods)


# --- the API ----------------------------------------------------------------------------------


def test_the_shorthand_is_one_role_named_worker_sharing_the_template() -> None:
    spec = GangJobSpec.model_validate({"replicas": 3, "template": TEMPLATE})
    (only,) = spec.effective_roles
    assert (only.name, only.replicas, only.ranked) == ("worker", 3, True)
    assert only.template is spec.template
    assert spec.shorthand
    assert [(w.worker, w.index, w.rank) for w in spec.workers] == [(0, 0, 0), (1, 1, 1), (2, 2, 2)]
    assert spec.world_size == 3


def test_ranked_roles_come_first_then_the_others() -> None:
    job = roles_job(
        [
            role("launcher", 1, SIMPLE, ranked=False),
            role("ps", 2, SIMPLE),
            role("worker", 3, SIMPLE),
        ]
    )
    slots = [(w.role.name, w.index, w.rank, w.worker) for w in job.spec.workers]
    assert slots == [
        ("ps", 0, 0, 0),
        ("ps", 1, 1, 1),
        ("worker", 0, 2, 2),
        ("worker", 1, 3, 3),
        ("worker", 2, 4, 4),
        ("launcher", 0, None, 5),
    ]
    assert job.spec.world_size == 5


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"roles": [role("a", 1, SIMPLE)], "replicas": 1, "template": SIMPLE}, "either spec.roles"),
        ({}, "either spec.roles"),
        ({"replicas": 1}, "go together"),
        ({"roles": [role("a", 1, SIMPLE), role("a", 1, SIMPLE)]}, "roles[1].name 'a'"),
        (
            {"roles": [role("a", 1, SIMPLE, depends_on=[("b", "Ready")]), role("b", 1, SIMPLE)]},
            "roles[0].dependsOn[].role 'b' must name an earlier role",
        ),
        ({"roles": [role("a", 1, SIMPLE, ranked=False)]}, "at least one role must be ranked"),
        (
            {"roles": [role("a", 1, SIMPLE)], "coordinator": {"role": "a", "index": 1}},
            "coordinator must name",
        ),
        (
            {
                "roles": [role("a", 1, SIMPLE)],
                "failurePolicy": {
                    "rules": [
                        {
                            "action": "Ignore",
                            "roles": ["b"],
                            "onExitCodes": {"operator": "In", "values": [1]},
                        }
                    ]
                },
            },
            "failurePolicy.rules[0].roles",
        ),
        (
            {"roles": [role("a", 1, SIMPLE)], "success": {"operator": "Any", "roles": ["b"]}},
            "success.roles",
        ),
        (
            {
                "roles": [role("a", 1, SIMPLE)],
                "success": {"operator": "Any"},
                "successPolicy": "Rank0",
            },
            "exclude each other",
        ),
    ],
)
def test_inconsistent_roles_are_rejected_naming_the_field(
    spec: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message.replace("[", r"\[").replace("]", r"\]")):
        GangJobSpec.model_validate(spec)


# --- names and environment ----------------------------------------------------------------------


def test_pods_env_and_labels_per_role() -> None:
    job = roles_job(
        [
            role("init", 1, SIMPLE, ranked=False),
            role("ps", 1, SIMPLE),
            role("worker", 2, SIMPLE),
        ],
        coordinator={"role": "worker", "index": 1},
        masterPort=1234,
    )
    w1 = build_pod(job, 2, "agent:1")
    assert w1["metadata"]["name"] == "llama-worker-1"
    assert (w1["spec"]["hostname"], w1["spec"]["subdomain"]) == ("llama-worker-1", "llama")
    labels = w1["metadata"]["labels"]
    assert labels["gangjob.io/role"] == "worker"
    assert labels["gangjob.io/role-index"] == "1"
    assert labels["gangjob.io/rank"] == "2"
    assert (
        env_of(w1).items()
        >= {
            "RANK": "2",
            "WORLD_SIZE": "3",
            "MASTER_ADDR": "llama-worker-1.llama",
            "MASTER_PORT": "1234",
            "GANGJOB_ROLE": "worker",
            "GANGJOB_ROLE_INDEX": "1",
            "GANGJOB_ROLE_REPLICAS": "2",
        }.items()
    )
    init = build_pod(job, 3, "agent:1")
    assert init["metadata"]["name"] == "llama-init-0"
    assert "RANK" not in env_of(init)
    assert env_of(init)["WORLD_SIZE"] == "3"
    assert [e["name"] for e in worker_env(job, 0)][:4] == [
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "RANK",
    ]


def test_an_error_in_a_roles_template_names_the_role() -> None:
    bad = {"spec": {"containers": [{"name": "gangjob-agent", "image": "x"}]}}
    job = roles_job([role("a", 1, SIMPLE), role("b", 1, bad)])
    with pytest.raises(ValueError, match=r"spec\.roles\[1\]\.template\.spec\.containers\[0\]"):
        build_pod(job, 1, "agent:1")


# --- start order ------------------------------------------------------------------------------


def test_ready_dependency_starts_the_launcher_behind_the_open_barrier() -> None:
    job = roles_job(
        [
            role("worker", 2, SIMPLE),
            role("launcher", 1, SIMPLE, ranked=False, depends_on=[("worker", "Ready")]),
        ]
    )
    first = plan(observe(job, now=T0))
    assert names(first) == ["llama-worker-0", "llama-worker-1"]
    assert state(first) == {"worker": RoleState.RUNNING, "launcher": RoleState.WAITING}
    # Created, not Ready: the launcher waits.
    world = carry_out(observe(job, now=T0), first)
    assert names(plan(world)) == []
    # Both arrived: the barrier opens, then they are Ready and the launcher starts late.
    world = running(world, "llama-worker-0", "llama-worker-1", ready=False)
    opened = plan(world)
    assert opened.status.barrier_epoch == 0
    world = running(carry_out(world, opened), "llama-worker-0", "llama-worker-1")
    started = plan(world)
    assert names(started) == ["llama-launcher-0"]
    launcher = {r.name: r for r in started.status.roles or ()}["launcher"]
    assert (launcher.state, launcher.started_late_at) == (RoleState.RUNNING, 0)
    # The launcher's pod not yet seen (a lagging cache): created again, not a gang failure.
    again = plan(carry_out(world, started, deletions=False))
    assert again.status.epoch == 0
    lagging = plan(dataclasses.replace(carry_out(world, started), pods=world.pods))
    assert lagging.status.epoch == 0
    assert names(lagging) == ["llama-launcher-0"]


def test_complete_dependency_and_a_completed_role_is_not_rerun() -> None:
    job = roles_job(
        [
            role("init", 1, SIMPLE, ranked=False),
            role("trainer", 2, SIMPLE, depends_on=[("init", "Complete")]),
        ]
    )
    first = plan(observe(job, now=T0))
    assert names(first) == ["llama-init-0"]
    world = running(carry_out(observe(job, now=T0), first), "llama-init-0")
    world = carry_out(world, plan(world))
    assert names(plan(world)) == []
    world = succeeded(world, "llama-init-0")
    started = plan(world)
    assert names(started) == ["llama-trainer-0", "llama-trainer-1"]
    assert state(started) == {"init": RoleState.COMPLETE, "trainer": RoleState.RUNNING}
    world = running(carry_out(world, started), "llama-trainer-0", "llama-trainer-1")
    world = carry_out(world, plan(world))
    assert world.job.status.barrier_epoch == 0

    # A trainer crashes: one bump; the initializer's Succeeded pod is neither deleted nor
    # recreated, and the barrier of epoch 1 waits for the trainers only.
    crashed = [
        dataclasses.replace(
            p,
            containers=(
                dataclasses.replace(p.containers[0], state="terminated", exit_code=3)
                if p.containers
                else _terminated(3),
            ),
        )
        if p.name == "llama-trainer-1"
        else p
        for p in world.pods
    ]
    bumped = plan(dataclasses.replace(world, pods=crashed))
    assert bumped.status.epoch == 1
    assert bumped.delete_pods == []
    assert bumped.create_pods == []
    world = carry_out(dataclasses.replace(world, pods=crashed), bumped)
    world = running(world, "llama-trainer-0", "llama-trainer-1", epoch=1)
    opened = plan(world)
    assert opened.status.barrier_epoch == 1
    assert state(opened)["init"] is RoleState.COMPLETE


def _terminated(code: int) -> Any:
    from controller.policy.views import ContainerView

    return ContainerView(name="trainer", state="terminated", exit_code=code)


# --- failure and success by role ---------------------------------------------------------------


def test_a_rule_applies_to_the_roles_it_names() -> None:
    rules = [
        {"action": "Ignore", "roles": ["eval"], "onExitCodes": {"operator": "In", "values": [5]}}
    ]
    job = roles_job(
        [role("trainer", 2, SIMPLE), role("eval", 1, SIMPLE, ranked=False)],
        failurePolicy={"rules": rules},
    )
    of_eval = Failure(2, FailureClass.PROCESS_EXIT, "exit 5", "trainer", 5, {"trainer": 5})
    of_trainer = dataclasses.replace(of_eval, worker=0)
    assert classify.decide(job, of_eval).action is FailureAction.IGNORE
    assert classify.decide(job, of_trainer).action is FailureAction.RESTART_GANG
    # The kubelet's rule of each role follows: 5 restarts a trainer's pod, not an evaluator's.
    trainer_codes = classify.retriable_exit_codes(job, job.spec.effective_roles[0])
    eval_codes = classify.retriable_exit_codes(job, job.spec.effective_roles[1])
    assert trainer_codes is not None
    assert eval_codes is not None
    assert 5 not in trainer_codes[1]
    assert 5 in eval_codes[1]


def _pods(job: GangJob, done: dict[int, str]) -> dict[int, PodView]:
    out = {}
    for worker in range(len(job.spec.workers)):
        view = PodView.from_pod(build_pod(job, worker, "agent:1"))
        phase = done.get(worker, "Running")
        out[worker] = dataclasses.replace(view, phase=phase)
    return out


def test_success_all_tolerates_ignored_failures_and_any_takes_one_worker() -> None:
    job = roles_job([role("trainer", 2, SIMPLE), role("eval", 1, SIMPLE, ranked=False)])
    pods = _pods(job, {0: "Succeeded", 1: "Succeeded", 2: "Failed"})
    assert job_succeeded(job, pods) is None
    reason, message = job_succeeded(job, pods, ignored={2}) or ("", "")
    assert reason == "AllWorkersSucceeded"
    assert "1 with a failure the policy ignores" in message

    only_trainers = roles_job(
        [role("trainer", 2, SIMPLE), role("eval", 1, SIMPLE, ranked=False)],
        success={"operator": "All", "roles": ["trainer"]},
    )
    assert job_succeeded(only_trainers, pods) is not None

    launcher = roles_job(
        [role("worker", 2, SIMPLE), role("launcher", 1, SIMPLE, ranked=False)],
        success={"operator": "Any", "roles": ["launcher"]},
    )
    assert job_succeeded(launcher, _pods(launcher, {0: "Succeeded", 1: "Succeeded"})) is None
    outcome = job_succeeded(launcher, _pods(launcher, {2: "Succeeded"}))
    assert outcome is not None
    assert outcome[0] == "AnyWorkerSucceeded"


def test_status_counts_per_role_and_the_printer_summary() -> None:
    job = roles_job([role("worker", 2, SIMPLE), role("eval", 1, SIMPLE, ranked=False)])
    first = plan(observe(job, now=T0))
    world = running(carry_out(observe(job, now=T0), first), "llama-worker-0", "llama-eval-0")
    result = plan(world)
    counts = {r.name: (r.replicas, r.ready, r.arrived) for r in result.status.roles or ()}
    assert counts == {"worker": (2, 1, 1), "eval": (1, 1, 1)}
    assert result.status.roles_ready == "worker 1/2, eval 1/1"
    assert isinstance(result.status, GangJobStatus)


def test_the_last_arrival_waits_for_the_running_roles_only() -> None:
    # What the manager's fast path counts before it queues the pass that opens the barrier.
    from controller.manager import barrier_waits_for

    status = {
        "roles": [
            {"name": "init", "state": "Complete", "replicas": 1},
            {"name": "worker", "state": "Running", "replicas": 4},
            {"name": "launcher", "state": "Running", "replicas": 1},
            {"name": "eval", "state": "Waiting", "replicas": 2},
        ]
    }
    assert barrier_waits_for({}, status) == 5
    assert barrier_waits_for({"replicas": 3}, {}) == 3
    assert barrier_waits_for({}, {}) is None


def test_the_old_pods_of_recreated_workers_are_deleted_before_failures_are_judged() -> None:
    # `complete` needs the ignored failures before `classify_failures` runs; the steps stay in
    # their order (delete_recreated first), so a pod this restart recreates, still shown not
    # terminating and arrived at the new epoch, is no second failure.
    from tests.unit.builders import make_job, make_pod

    job = make_job(replicas=2)
    world = observe(job, [make_pod(0, phase="Failed"), make_pod(1, phase="Failed", epoch=1)])
    first = plan(world)
    assert first.status.epoch == 1
    again = plan(carry_out(world, first, deletions=False))
    assert again.status.epoch == 1
    assert again.events == []


def test_torchrun_variables_follow_the_ranked_roles() -> None:
    """A pod of a ranked role is one torchrun node: its node rank is its global `RANK`, the
    nodes are `WORLD_SIZE`, `auto` is its own role's GPU limit; an unranked role gets none."""
    gpus = {
        "spec": {
            "containers": [
                {
                    "name": "trainer",
                    "image": "t:1",
                    "command": ["run"],
                    "resources": {"limits": {"nvidia.com/gpu": "8"}},
                }
            ]
        }
    }
    job = roles_job(
        [
            role("launcher", 1, SIMPLE, ranked=False),
            role("ps", 1, SIMPLE),
            role("worker", 2, gpus),
        ],
        nprocPerNode="auto",
        coordinator={"role": "worker", "index": 0},
    )
    # Workers are numbered by rank first, the unranked launcher last.
    envs = [env_of(build_pod(job, worker, "agent:1")) for worker in range(4)]
    assert envs[3]["GANGJOB_ROLE"] == "launcher"
    assert not any(k.startswith("PET_") for k in envs[3])
    assert [(e["PET_NODE_RANK"], e["PET_NNODES"], e["PET_NPROC_PER_NODE"]) for e in envs[:3]] == [
        ("0", "3", "1"),
        ("1", "3", "8"),
        ("2", "3", "8"),
    ]
    assert {e["PET_MASTER_ADDR"] for e in envs[:3]} == {f"{JOB_NAME}-worker-0.{JOB_NAME}"}
    assert [e["RANK"] for e in envs[:3]] == ["0", "1", "2"]
