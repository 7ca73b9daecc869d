"""Roles on the sim cluster (issue 15): the real apiserver's CEL rules, and the real controller with
the real agents (localcluster.simkubelet plays the kubelet): start order, names, labels and env
per role, one restart and one barrier across the running roles, per-role failure rules,
`Ignore`, and the success policy by roles."""

# ruff: noqa: F811 (the `gang` fixture of test_restart, imported, is every test's parameter)

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from api.builders import gangjob, role
from controller.k8s import CORE_EVENTS, GANGJOBS, PODS, Invalid, JsonDict, Kube
from localcluster.cluster import SIMULATED_KUBELET_LABEL
from tests.integration.harness import install_crd, watch_job
from tests.integration.test_restart import (  # noqa: F401 (fixtures)
    Gang,
    _phase,
    ctl_kubeconfig,
    gang,
    uids,
)
from tests.waiting import wait_for_pods

pytestmark = pytest.mark.integration


def template(ns: str, command: str = "sleep infinity") -> dict[str, Any]:
    return {
        "metadata": {"labels": {SIMULATED_KUBELET_LABEL: "true"}},
        "spec": {
            "nodeSelector": {"gangjob-test": ns},
            "containers": [
                {
                    "name": "trainer",
                    "image": "localhost/busybox:dev",
                    "command": ["sh", "-c", command],
                }
            ],
        },
    }


async def create(gang: Gang, name: str, roles: list[JsonDict], **spec: Any) -> JsonDict:
    body = gangjob(name, None, spec={"roles": roles, **spec})
    return await gang.kube.create(GANGJOBS, body, gang.ns)


def env(pod: JsonDict) -> dict[str, str]:
    (trainer,) = [c for c in pod["spec"]["containers"] if c["name"] == "trainer"]
    return {e["name"]: e["value"] for e in trainer.get("env", []) if "value" in e}


def roles_of(job: JsonDict) -> dict[str, JsonDict]:
    return {r["name"]: r for r in job.get("status", {}).get("roles", [])}


async def barrier_at(gang: Gang, name: str, epoch: int, arrived: int) -> JsonDict:
    def at(j: JsonDict) -> bool:
        st = j.get("status", {})
        return bool(
            st.get("epoch") == epoch
            and st.get("barrierEpoch") == epoch
            and st.get("workers", {}).get("arrived") == arrived
        )

    return await watch_job(gang.kube, gang.ns, name, at, 60, f"barrier open at {epoch}")


async def test_ready_dependency_names_env_and_one_restart_across_roles(gang: Gang) -> None:
    roles = [
        role("worker", 2, template(gang.ns)),
        role("launcher", 1, template(gang.ns), ranked=False, depends_on=[("worker", "Ready")]),
    ]
    await create(gang, "mpi", roles, coordinator={"role": "worker", "index": 1})

    # The workers start alone; the launcher only once both are Ready, behind the open barrier.
    await gang.agents_at(0, ["mpi-worker-0", "mpi-worker-1"])

    def launcher_running(j: JsonDict) -> bool:
        launcher = roles_of(j).get("launcher", {})
        return bool(launcher.get("state") == "Running" and launcher.get("arrived") == 1)

    job = await watch_job(gang.kube, gang.ns, "mpi", launcher_running, 60, "launcher arrived")
    pods = await gang.pods("mpi")
    assert set(pods) == {"mpi-worker-0", "mpi-worker-1", "mpi-launcher-0"}
    worker_created = {pods[n]["metadata"]["creationTimestamp"] for n in pods if "worker" in n}
    assert pods["mpi-launcher-0"]["metadata"]["creationTimestamp"] >= max(worker_created)
    await gang.agents_at(0, list(pods))

    # Names, labels, DNS and env per role and index.
    w1, launcher = pods["mpi-worker-1"], pods["mpi-launcher-0"]
    assert (
        w1["metadata"]["labels"].items()
        >= {
            "gangjob.io/name": "mpi",
            "gangjob.io/role": "worker",
            "gangjob.io/role-index": "1",
            "gangjob.io/rank": "1",
        }.items()
    )
    assert (w1["spec"]["hostname"], w1["spec"]["subdomain"]) == ("mpi-worker-1", "mpi")
    assert launcher["metadata"]["labels"]["gangjob.io/role"] == "launcher"
    selected = await gang.kube.list(PODS, gang.ns, label_selector="gangjob.io/role=worker")
    assert {p["metadata"]["name"] for p in selected.items} == {"mpi-worker-0", "mpi-worker-1"}
    assert (
        env(w1).items()
        >= {
            "RANK": "1",
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "mpi-worker-1.mpi",
            "MASTER_PORT": "29500",
            "GANGJOB_ROLE": "worker",
            "GANGJOB_ROLE_INDEX": "1",
        }.items()
    )
    assert "RANK" not in env(launcher)
    assert (
        env(launcher).items()
        >= {
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "mpi-worker-1.mpi",
            "GANGJOB_ROLE": "launcher",
            "GANGJOB_ROLE_INDEX": "0",
        }.items()
    )
    assert job["status"]["rolesReady"] == "worker 2/2, launcher 1/1"

    # A failure in the ranked role restarts every running role in place at one new epoch,
    # behind one barrier.
    before = uids(pods)
    await gang.sim.crash("mpi-worker-0", 1)
    job = await barrier_at(gang, "mpi", 1, 3)
    assert job["status"]["restarts"]["total"] == 1
    assert job["status"]["restarts"]["inPlace"] == 1
    assert uids(await gang.pods("mpi")) == before
    await gang.agents_at(1, list(before))
    assert {r["name"]: r["arrived"] for r in job["status"]["roles"]} == {
        "worker": 2,
        "launcher": 1,
    }
    job = await gang.kube.get(GANGJOBS, "mpi", gang.ns)
    assert job["status"]["epoch"] == 1
    # One restart, one barrier opening, for both roles. (The controller posts its Events
    # after the status write that opened the barrier: a moment later.)
    deadline = asyncio.get_running_loop().time() + 10
    while True:
        events = (await gang.kube.list(CORE_EVENTS, gang.ns)).items
        reasons = [e["reason"] for e in events if e["involvedObject"]["name"] == "mpi"]
        if "GangRestarted" in reasons or asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.2)
    assert reasons.count("GangRestarting") == 1
    assert reasons.count("GangRestarted") == 1


async def test_complete_dependency_runs_once_and_is_not_rerun_by_a_restart(gang: Gang) -> None:
    roles = [
        role("init", 1, template(gang.ns), ranked=False),
        role("trainer", 2, template(gang.ns), depends_on=[("init", "Complete")]),
    ]
    await create(gang, "ckpt", roles)
    await barrier_at(gang, "ckpt", 0, 1)
    await gang.agents_at(0, ["ckpt-init-0"])
    # Until the initializer completes, no trainer exists.
    assert set(await gang.pods("ckpt")) == {"ckpt-init-0"}
    await gang.sim.crash("ckpt-init-0", 0)

    def trainers_arrived(j: JsonDict) -> bool:
        r = roles_of(j)
        return (
            r.get("init", {}).get("state") == "Complete"
            and r.get("trainer", {}).get("arrived") == 2
        )

    job = await watch_job(gang.kube, gang.ns, "ckpt", trainers_arrived, 60, "trainers arrived")
    trainers = ["ckpt-trainer-0", "ckpt-trainer-1"]
    await gang.agents_at(0, trainers)
    before = uids(await gang.pods("ckpt"))
    assert env((await gang.pods("ckpt"))["ckpt-trainer-1"])["RANK"] == "1"

    await gang.sim.crash("ckpt-trainer-1", 1)
    job = await barrier_at(gang, "ckpt", 1, 2)
    pods = await gang.pods("ckpt")
    # The trainers restarted in place; the initializer was neither recreated nor rerun.
    assert uids(pods) == before
    assert pods["ckpt-init-0"]["status"]["phase"] == "Succeeded"
    assert roles_of(job)["init"]["state"] == "Complete"
    await gang.agents_at(1, trainers)


async def test_a_rule_targets_a_role_and_ignore_does_not_block_success(gang: Gang) -> None:
    roles = [
        role("trainer", 2, template(gang.ns)),
        role("evaluator", 1, template(gang.ns), ranked=False),
    ]
    rules = [
        {
            "action": "Ignore",
            "roles": ["evaluator"],
            "onExitCodes": {"operator": "In", "values": [5]},
        },
        {
            "action": "FailJob",
            "roles": ["trainer"],
            "onExitCodes": {"operator": "In", "values": [6]},
        },
    ]
    await create(gang, "eval", roles, failurePolicy={"rules": rules})
    await barrier_at(gang, "eval", 0, 3)
    names = ["eval-trainer-0", "eval-trainer-1", "eval-evaluator-0"]
    await gang.agents_at(0, names)

    # Code 6 fails the job only for a trainer: an evaluator's 6 restarts the gang by default.
    await gang.sim.crash("eval-evaluator-0", 6)
    job = await barrier_at(gang, "eval", 1, 3)
    assert job["status"]["lastRestart"]["trigger"]["worker"] == 2
    await gang.agents_at(1, names)

    # The evaluator's 5 is ignored: no restart, and it does not keep the job from succeeding.
    await gang.sim.crash("eval-evaluator-0", 5)

    def evaluator_failed(j: JsonDict) -> bool:
        return bool(roles_of(j).get("evaluator", {}).get("failed") == 1)

    job = await watch_job(gang.kube, gang.ns, "eval", evaluator_failed, 30, "evaluator failed")
    assert job["status"]["epoch"] == 1
    for name in names[:2]:
        await gang.sim.crash(name, 0)
    job = await watch_job(gang.kube, gang.ns, "eval", _phase("Succeeded"), 60, "Succeeded")
    assert job["status"]["epoch"] == 1
    succeeded = {c["type"]: c for c in job["status"]["conditions"]}["Succeeded"]
    assert "failure the policy ignores" in succeeded["message"]


async def test_success_any_on_the_launcher_stops_the_workers(gang: Gang) -> None:
    roles = [
        role("worker", 2, template(gang.ns)),
        role("launcher", 1, template(gang.ns), ranked=False, depends_on=[("worker", "Ready")]),
    ]
    await create(gang, "drv", roles, success={"operator": "Any", "roles": ["launcher"]})

    def launcher_arrived(j: JsonDict) -> bool:
        return bool(roles_of(j).get("launcher", {}).get("arrived") == 1)

    await watch_job(gang.kube, gang.ns, "drv", launcher_arrived, 60, "launcher arrived")
    await gang.agents_at(0, ["drv-worker-0", "drv-worker-1", "drv-launcher-0"])
    await gang.sim.crash("drv-launcher-0", 0)
    job = await watch_job(gang.kube, gang.ns, "drv", _phase("Succeeded"), 60, "Succeeded")
    succeeded = {c["type"]: c for c in job["status"]["conditions"]}["Succeeded"]
    assert succeeded["reason"] == "AnyWorkerSucceeded"

    # The workers still running are stopped, their devices freed, their pods kept for their
    # logs (`cleanPodPolicy: None`).
    def stopped(pods: list[JsonDict]) -> bool:
        phases = {p["metadata"]["name"]: p.get("status", {}).get("reason") for p in pods}
        return all(phases.get(f"drv-worker-{i}") == "DeadlineExceeded" for i in range(2))

    await wait_for_pods(gang.kube, gang.ns, stopped, 60, "workers stopped")
    pods = await gang.pods("drv")
    assert sorted(pods) == ["drv-launcher-0", "drv-worker-0", "drv-worker-1"]
    assert not [n for n, p in pods.items() if p["metadata"].get("deletionTimestamp")]
    assert {p["status"]["phase"] for p in pods.values()} == {"Succeeded", "Failed"}


# --- admission: CEL rules and immutability ----------------------------------------------------


def _roles_job(name: str, ns: str, roles: list[JsonDict], **spec: Any) -> JsonDict:
    return gangjob(name, None, namespace=ns, spec={"roles": roles, **spec})


async def _rejected(kube: Kube, ns: str, body: JsonDict) -> str:
    with pytest.raises(Invalid) as caught:
        await kube.create(GANGJOBS, body, ns)
    return str(caught.value)


async def test_the_apiserver_rejects_inconsistent_roles(sim_kube: Kube, namespace: str) -> None:
    await install_crd(sim_kube)
    t = template(namespace)
    cases: dict[str, tuple[list[JsonDict], JsonDict, str]] = {
        "later": (
            [role("a", 1, t, depends_on=[("b", "Ready")]), role("b", 1, t)],
            {},
            "dependsOn[].role must name an earlier role",
        ),
        "self": (
            [role("a", 1, t, depends_on=[("a", "Ready")])],
            {},
            "dependsOn[].role must name an earlier role",
        ),
        "unranked coordinator": (
            [role("a", 1, t), role("b", 1, t, ranked=False)],
            {"coordinator": {"role": "b"}},
            "coordinator must name a ranked role",
        ),
        "coordinator index": (
            [role("a", 2, t)],
            {"coordinator": {"role": "a", "index": 2}},
            "coordinator must name a ranked role",
        ),
        "no ranked role": ([role("a", 1, t, ranked=False)], {}, "at least one role must be ranked"),
        "duplicate": ([role("a", 1, t), role("a", 2, t)], {}, "Duplicate value"),
        "rule role": (
            [role("a", 1, t)],
            {
                "failurePolicy": {
                    "rules": [
                        {
                            "action": "Ignore",
                            "roles": ["x"],
                            "onExitCodes": {"operator": "In", "values": [1]},
                        }
                    ]
                }
            },
            "failurePolicy.rules[].roles must name roles",
        ),
        "success role": (
            [role("a", 1, t)],
            {"success": {"operator": "All", "roles": ["x"]}},
            "success.roles must name roles",
        ),
    }
    for what, (roles, spec, message) in cases.items():
        error = await _rejected(sim_kube, namespace, _roles_job("bad", namespace, roles, **spec))
        assert message in error, (what, error)
    both = gangjob("both", 1, namespace=namespace, template=t, spec={"roles": [role("a", 1, t)]})
    assert "set either spec.roles or spec.replicas" in await _rejected(sim_kube, namespace, both)


async def test_every_immutable_field_is_refused_naming_it(sim_kube: Kube, namespace: str) -> None:
    await install_crd(sim_kube)
    t = template(namespace)
    await sim_kube.create(
        GANGJOBS,
        _roles_job(
            "fixed",
            namespace,
            [role("a", 2, t), role("b", 1, t, ranked=False)],
            coordinator={"role": "a", "index": 0},
            suspend=True,
        ),
        namespace,
    )
    await sim_kube.create(GANGJOBS, gangjob("short", 2, namespace=namespace, template=t), namespace)
    changes: list[tuple[str, JsonDict, str]] = [
        (
            "fixed",
            {"spec": {"roles": [role("a", 3, t), role("b", 1, t, ranked=False)]}},
            "roles[].replicas",
        ),
        (
            "fixed",
            {"spec": {"roles": [role("a", 2, t), role("b", 1, t, ranked=True)]}},
            "roles[].ranked",
        ),
        ("fixed", {"spec": {"roles": [role("a", 2, t)]}}, "roles"),
        ("fixed", {"spec": {"coordinator": {"role": "a", "index": 1}}}, "coordinator"),
        ("fixed", {"spec": {"masterPort": 1234}}, "masterPort"),
        ("short", {"spec": {"replicas": 3}}, "replicas"),
        ("short", {"spec": {"template": {"metadata": {"labels": {"x": "y"}}}}}, "template"),
    ]
    for name, patch, field in changes:
        with pytest.raises(Invalid) as caught:
            await sim_kube.patch(GANGJOBS, name, patch, namespace)
        assert f"spec.{field} is immutable" in str(caught.value), (field, str(caught.value))
    # What stays mutable: suspend and the restart budget.
    patch = {"spec": {"suspend": False, "restart": {"maxRestarts": 3}}}
    job = await sim_kube.patch(GANGJOBS, "fixed", patch, namespace)
    assert job["spec"]["suspend"] is False
    assert job["spec"]["restart"]["maxRestarts"] == 3
