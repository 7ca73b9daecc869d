"""Elastic gangs on the sim cluster (docs/design.md section 3.12): the real controller resizes a
gang in place when its `replicas` changes, shrinking and growing, with the kept pods' UIDs
unchanged and the new world seen by every agent's trainer (`Process` mode: the trainer run's
environment; `Pod` mode: the `world` file the kubelet-started trainer reads); the apiserver
refuses a size outside the bounds, and a change of a job that is not elastic; a node lost with
no room for its worker shrinks the gang, and a new node grows it back; a spare takes a lost
worker's place in place (in `Process` and `Pod` modes), and the new pod becomes the spare;
`Recreate` mode refuses spares."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import time
from typing import Any

import pytest

from agent.protocol import read_world_file
from api.builders import gangjob, leader_and_elastic
from api.constants import KUEUE_QUEUE_NAME_LABEL
from controller.k8s import (
    CORE_EVENTS,
    GANGJOBS,
    NODES,
    PODS,
    ApiError,
    Invalid,
    JsonDict,
    Kube,
    NotFound,
)
from gangjob.client import AsyncClient
from localcluster.cluster import SIMULATED_KUBELET_LABEL, Cluster, Options, kwok_node
from localcluster.simkubelet import SimKubelet
from localcluster.tools import REPO, kubectl
from tests.integration.harness import install_crd, watch_job
from tests.integration.test_restart import (  # noqa: F401 (fixtures)
    Gang,
    _lose_node,
    ctl_kubeconfig,
    gang,
    uids,
)
from tests.waiting import wait_for_pods

pytestmark = pytest.mark.integration

ELASTIC = {"minReplicas": 2, "maxReplicas": 6}


def world_seen(sim: SimKubelet, name: str, mode: str) -> dict[str, str]:
    """What the worker's trainer was told of its epoch: `Process` mode, the environment of the
    agent's latest trainer run; `Pod` mode, the agent's `world` file."""
    w = sim.workers[name]
    if mode == "Process":
        assert w.trainer is not None, f"{name}: no trainer run"
        env = w.trainer.env
    else:
        env = read_world_file((w.dir / "world").read_text())
    return {k: env[k] for k in ("GANGJOB_EPOCH", "RANK", "WORLD_SIZE", "PET_NNODES") if k in env}


async def resize(g: Gang, job: str, replicas: int) -> None:
    await g.kube.patch(GANGJOBS, job, {"spec": {"replicas": replicas}}, g.ns)


async def only_pods(g: Gang, job: str, names: set[str]) -> dict[str, JsonDict]:
    def exactly(pods: list[JsonDict]) -> bool:
        return {p["metadata"]["name"] for p in pods} == names

    await wait_for_pods(g.kube, g.ns, exactly, 30, f"pods {sorted(names)}")
    return await g.pods(job)


@pytest.mark.parametrize("mode", ["Process", "Pod"])
async def test_shrink_and_grow_in_place_keep_uids_and_give_the_new_world(
    gang: Gang,  # noqa: F811 (the fixture)
    mode: str,
) -> None:
    await gang.create("el", 4, restart={"mode": mode}, elastic=ELASTIC)
    job = await gang.running_at("el", 0, 4)
    assert job["status"]["worldSize"] == 4
    before = uids(await gang.pods("el"))
    await gang.agents_at(0, list(before))

    # Shrink 4 -> 3: el-3 goes, el-0..2 restart in place at epoch 1 with a world of 3.
    await resize(gang, "el", 3)
    job = await gang.running_at("el", 1, 3)
    st = job["status"]
    assert st["worldSize"] == 3
    last = st["lastRestart"]
    assert last["trigger"]["class"] == "Resized"
    assert last["trigger"]["detail"] == "resized 4 -> 3 (replicas changed)"
    assert last["recreated"] == []
    assert not last.get("counted")
    kept = {n: before[n] for n in ("el-0", "el-1", "el-2")}
    assert uids(await only_pods(gang, "el", set(kept))) == kept
    await gang.agents_at(1, list(kept))
    for rank, name in enumerate(sorted(kept)):
        assert world_seen(gang.sim, name, mode) == {
            "GANGJOB_EPOCH": "1",
            "RANK": str(rank),
            "WORLD_SIZE": "3",
            "PET_NNODES": "3",
        }

    # Grow 3 -> 5: el-3 and el-4 are new pods, el-0..2 the same, everyone at a world of 5.
    await resize(gang, "el", 5)
    job = await gang.running_at("el", 2, 5)
    assert job["status"]["worldSize"] == 5
    assert job["status"]["lastRestart"]["trigger"]["detail"] == "resized 3 -> 5 (replicas changed)"
    after = uids(await gang.pods("el"))
    assert set(after) == {f"el-{r}" for r in range(5)}
    assert {n: after[n] for n in kept} == kept
    assert after["el-3"] != before["el-3"]
    await gang.agents_at(2, list(after))
    for rank in range(5):
        seen = world_seen(gang.sim, f"el-{rank}", mode)
        assert seen == {
            "GANGJOB_EPOCH": "2",
            "RANK": str(rank),
            "WORLD_SIZE": "5",
            "PET_NNODES": "5",
        }
    assert job["status"]["restarts"]["counted"] == 0

    # The Events say it, as `kubectl describe gj` shows them.
    events = (await gang.kube.list(CORE_EVENTS, gang.ns)).items
    messages = [
        e["message"]
        for e in events
        if e["involvedObject"]["name"] == "el" and e["reason"] == "GangRestarting"
    ]
    assert any("resized 4 -> 3 (replicas changed)" in m for m in messages), messages
    assert any("resized 3 -> 5 (replicas changed)" in m for m in messages), messages

    # Out of bounds, refused naming the field; the gang is untouched.
    with pytest.raises(Invalid) as caught:
        await resize(gang, "el", 7)
    assert "replicas must be within spec.elastic.minReplicas..spec.elastic.maxReplicas" in str(
        caught.value
    )
    pods = (await gang.kube.list(PODS, gang.ns)).items
    assert len([p for p in pods if p["metadata"]["name"].startswith("el-")]) == 5


async def test_replicas_of_a_job_that_is_not_elastic_stay_immutable(
    gang: Gang,  # noqa: F811 (the fixture)
) -> None:
    await gang.create("fixed", 2)
    with pytest.raises(Invalid) as caught:
        await resize(gang, "fixed", 3)
    assert "spec.replicas is immutable unless spec.elastic is set" in str(caught.value)


async def test_a_node_lost_without_capacity_shrinks_the_gang_and_it_grows_back(
    gang: Gang,  # noqa: F811 (the fixture)
) -> None:
    # One worker a node (each takes both GPUs of its node), three nodes: a lost node's worker
    # finds no room.
    await gang.create(
        "sh", 3, restart={"mode": "Process"}, nodeLoss={"forceDeleteAfterSeconds": 2},
        elastic={"minReplicas": 2, "maxReplicas": 3, "waitSeconds": 3, "growAfterSeconds": 0},
        trainer={"resources": {"limits": {"nvidia.com/gpu": 2}}},
    )  # fmt: skip
    await gang.running_at("sh", 0, 3)
    before = uids(await gang.pods("sh"))
    await gang.agents_at(0, list(before))
    node = (await gang.pods("sh"))["sh-2"]["spec"]["nodeName"]
    gang.sim.lose("sh-2")
    await _lose_node(gang.kube, node)

    def shrunk(j: JsonDict) -> bool:
        st = j.get("status", {})
        return bool(
            st.get("worldSize") == 2
            and st.get("dropped") == [2]
            and st.get("barrierEpoch") == st.get("epoch")
        )

    job = await watch_job(gang.kube, gang.ns, "sh", shrunk, 90, "shrunk to 2")
    st = job["status"]
    assert st["lastRestart"]["trigger"]["detail"] == "resized 3 -> 2 (node lost, no capacity)"
    assert st["restarts"]["counted"] == 0
    pods = await gang.pods("sh")
    assert {n: uids(pods)[n] for n in ("sh-0", "sh-1")} == {n: before[n] for n in ("sh-0", "sh-1")}
    assert pods["sh-2"]["metadata"]["uid"] != before["sh-2"]  # recreated, and waiting
    assert not pods["sh-2"]["spec"].get("nodeName")
    shrunk_epoch = st["epoch"]
    await gang.agents_at(shrunk_epoch, ["sh-0", "sh-1"])
    for rank in (0, 1):
        assert world_seen(gang.sim, f"sh-{rank}", "Process") == {
            "GANGJOB_EPOCH": str(shrunk_epoch),
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "PET_NNODES": "2",
        }

    # Capacity returns: a new node; the waiting worker is placed and the gang grows back.
    extra = f"{gang.ns}-n9"
    try:
        await _add_node(gang, extra)
        job = await gang.running_at("sh", shrunk_epoch + 1, 3, timeout=90)
        st = job["status"]
        assert (st["worldSize"], st.get("dropped", [])) == (3, [])
        assert st["lastRestart"]["trigger"]["detail"] == "resized 2 -> 3 (capacity returned)"
        after = uids(await gang.pods("sh"))
        assert {n: after[n] for n in ("sh-0", "sh-1")} == {n: before[n] for n in ("sh-0", "sh-1")}
        assert after["sh-2"] == pods["sh-2"]["metadata"]["uid"]  # the pod that waited
        await gang.agents_at(shrunk_epoch + 1, list(after))
        for rank in range(3):
            seen = world_seen(gang.sim, f"sh-{rank}", "Process")
            assert (seen["RANK"], seen["WORLD_SIZE"]) == (str(rank), "3")
    finally:
        with contextlib.suppress(NotFound):
            await gang.kube.delete(NODES, extra)


async def test_a_job_queued_by_kueue_keeps_the_size_kueue_admitted(
    sim_cluster: Cluster, sim_kube: Kube, namespace: str
) -> None:
    # Kueue admits a queued job's pods as a group of a fixed count: manifests/policy refuses a
    # new `replicas` for it (a CRD's CEL sees no labels), and leaves an unqueued one alone.
    await install_crd(sim_kube)
    kubectl(sim_cluster, "apply", "-k", str(REPO / "manifests" / "policy"))
    elastic = {"elastic": {"minReplicas": 1, "maxReplicas": 4}, "suspend": True}
    for name, labels in (("queued", {KUEUE_QUEUE_NAME_LABEL: "team-a"}), ("free", {})):
        body = gangjob(
            name, 2, labels=labels, image="localhost/busybox:dev", command=["sleep", "1"],
            spec=elastic,
        )  # fmt: skip
        await sim_kube.create(GANGJOBS, body, namespace)
    await sim_kube.patch(GANGJOBS, "free", {"spec": {"replicas": 3}}, namespace)
    deadline = time.monotonic() + 90  # a policy just applied takes a moment to be in force
    refused = ""
    while not refused and time.monotonic() < deadline:
        try:
            await sim_kube.patch(GANGJOBS, "queued", {"spec": {"replicas": 3}}, namespace)
            await sim_kube.patch(GANGJOBS, "queued", {"spec": {"replicas": 2}}, namespace)
            await asyncio.sleep(0.5)
        except ApiError as error:
            refused = error.message
    assert "ValidatingAdmissionPolicy 'gangjob-queued-size'" in refused, refused
    assert "spec.replicas: a GangJob queued by Kueue" in refused
    assert "resizing a queued job is not supported" in refused
    # Anything else of it may still change.
    await sim_kube.patch(
        GANGJOBS, "queued", {"metadata": {"annotations": {"note": "x"}}}, namespace
    )
    # An elastic role's size as well.
    body = gangjob("queued-roles", 1, labels={KUEUE_QUEUE_NAME_LABEL: "team-a"},
                   image="localhost/busybox:dev", command=["sleep", "1"],
                   spec={"suspend": True})  # fmt: skip
    leader_and_elastic(body, 2, {"minReplicas": 1, "maxReplicas": 4})
    await sim_kube.create(GANGJOBS, body, namespace)
    body["spec"]["roles"][1]["replicas"] = 3
    with pytest.raises(ApiError) as caught:
        await sim_kube.patch(
            GANGJOBS, "queued-roles", {"spec": {"roles": body["spec"]["roles"]}}, namespace
        )
    assert "spec.roles[].replicas: a GangJob queued by Kueue" in caught.value.message
    assert "keeps the size Kueue admitted (leader 1, worker 2)" in caught.value.message


@pytest.mark.parametrize("mode", ["Process", "Pod"])
async def test_a_spare_takes_a_lost_workers_place_in_place(
    gang: Gang,  # noqa: F811 (the fixture)
    mode: str,
) -> None:
    # Two workers and a spare, one pod a node (each takes both GPUs of its node), three nodes:
    # the lost node's worker finds no room, and the spare goes on in its place (`Pod` mode:
    # its pod restarts in place with the kept worker's).
    await gang.create(
        "sp", 2, restart={"mode": mode}, nodeLoss={"forceDeleteAfterSeconds": 2},
        elastic={"minReplicas": 1, "maxReplicas": 2, "spares": 1, "waitSeconds": 300},
        trainer={"resources": {"limits": {"nvidia.com/gpu": 2}}},
    )  # fmt: skip
    job = await gang.running_at("sp", 0, 3)  # the spare's agent arrives too
    assert (job["status"]["worldSize"], job["status"]["dropped"]) == (2, [2])
    before = uids(await gang.pods("sp"))
    await gang.agents_at(0, ["sp-0", "sp-1"])
    spare = gang.sim.workers["sp-2"]
    assert spare.trainer is None  # a spare starts no trainer
    node = (await gang.pods("sp"))["sp-1"]["spec"]["nodeName"]
    gang.sim.lose("sp-1")
    await _lose_node(gang.kube, node)

    def swapped(j: JsonDict) -> bool:
        st = j.get("status", {})
        return bool(
            st.get("epoch") == 1 and st.get("barrierEpoch") == 1 and st.get("dropped") == [1]
        )

    job = await watch_job(gang.kube, gang.ns, "sp", swapped, 90, "spare sp-2 in sp-1's place")
    st = job["status"]
    assert st["worldSize"] == 2
    assert st["lastRestart"]["trigger"]["class"] == "NodeLost"
    assert st["lastRestart"]["trigger"]["detail"].endswith("; spare 2 takes worker 1's place")
    assert st["lastRestart"]["recreated"] == [1]
    assert st["places"] == [{"worker": 2, "place": 1}]  # the spare holds worker 1's rank

    # The barrier did not wait for worker 1's new pod, created in the background once the
    # old one was force-deleted; it waits for room.
    def renewed(pods: list[JsonDict]) -> bool:
        return any(
            p["metadata"]["name"] == "sp-1" and p["metadata"]["uid"] != before["sp-1"] for p in pods
        )

    await wait_for_pods(gang.kube, gang.ns, renewed, 30, "sp-1 created again")
    pods = await gang.pods("sp")
    # In place: the kept worker's and the spare's pods are the same pods.
    assert {n: uids(pods)[n] for n in ("sp-0", "sp-2")} == {n: before[n] for n in ("sp-0", "sp-2")}
    assert not pods["sp-1"]["spec"].get("nodeName")
    await gang.agents_at(1, ["sp-0", "sp-2"])
    assert world_seen(gang.sim, "sp-0", mode) == {
        "GANGJOB_EPOCH": "1",
        "RANK": "0",
        "WORLD_SIZE": "2",
        "PET_NNODES": "2",
    }
    assert world_seen(gang.sim, "sp-2", mode) == {
        "GANGJOB_EPOCH": "1",
        "RANK": "1",
        "WORLD_SIZE": "2",
        "PET_NNODES": "2",
    }
    events = (await gang.kube.list(CORE_EVENTS, gang.ns)).items
    took = [
        e["message"]
        for e in events
        if e["involvedObject"]["name"] == "sp" and e["reason"] == "SpareTookOver"
    ]
    assert took == ["Spare 2 takes worker 1's place at epoch 1; worker 1's new pod will be a spare"]

    # Room again: sp-1's new pod is placed and becomes the spare, with no restart.
    extra = f"{gang.ns}-n9"
    try:
        await _add_node(gang, extra)
        job = await gang.running_at("sp", 1, 3, timeout=90)
        assert (job["status"]["worldSize"], job["status"]["dropped"]) == (2, [1])
        new_spare = gang.sim.workers["sp-1"]
        assert new_spare.agent is not None
        assert new_spare.trainer is None
        assert uids(await gang.pods("sp"))["sp-1"] == pods["sp-1"]["metadata"]["uid"]
    finally:
        with contextlib.suppress(NotFound):
            await gang.kube.delete(NODES, extra)


async def test_spares_are_refused_in_recreate_mode(
    gang: Gang,  # noqa: F811 (the fixture)
) -> None:
    with pytest.raises(Invalid) as caught:
        await gang.create(
            "rec", 2, restart={"mode": "Recreate"},
            elastic={"minReplicas": 1, "maxReplicas": 2, "spares": 1},
        )  # fmt: skip
    assert "elastic.spares requires a restart mode that keeps the pods" in str(caught.value)
    assert "spec.elastic.spares" in str(caught.value)


async def _add_node(gang: Gang, name: str) -> None:  # noqa: F811 (the fixture's type)
    """A node of two GPUs for the gang's namespace, opened to the scheduler only once KWOK has
    written its status (Ready, the GPUs) and the controller's cache has had a moment to see
    it: a pod bound to a node whose cached copy is still the bare one (no Ready, no GPUs) is
    judged lost there and recreated, a race of a brand-new node that a kubelet's registered
    node does not run into as often."""
    node = kwok_node(name, Options(gpus_per_node=2))
    node["metadata"]["labels"]["gangjob-test"] = gang.ns
    node.setdefault("spec", {})["unschedulable"] = True
    await gang.kube.create(NODES, node)
    deadline = time.monotonic() + 60
    while True:
        got = await gang.kube.get(NODES, name)
        status = got.get("status", {})
        conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
        if (
            conditions.get("Ready") == "True"
            and status.get("allocatable", {}).get("nvidia.com/gpu") == "2"
        ):
            break
        assert time.monotonic() < deadline, status
        await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)
    await gang.kube.patch(NODES, name, {"spec": {"unschedulable": False}})


def _roles_body(gang: Gang, name: str, workers: int, **elastic: Any) -> JsonDict:  # noqa: F811
    """`leader` (1, the coordinator), then `worker`, elastic: the job `Gang.create` makes,
    in roles."""
    body = gangjob(
        name, 1,
        image="localhost/busybox:dev", command=["sh", "-c", "sleep infinity"],
        pod_spec={"nodeSelector": {"gangjob-test": gang.ns}},
        pod_labels={SIMULATED_KUBELET_LABEL: "true"},
        spec={"restart": {"mode": "Process"}},
    )  # fmt: skip
    return leader_and_elastic(body, workers, {"minReplicas": 1, "maxReplicas": 4, **elastic})


async def test_an_elastic_role_resizes_in_place_around_the_fixed_roles(
    gang: Gang,  # noqa: F811 (the fixture)
) -> None:
    await gang.kube.create(GANGJOBS, _roles_body(gang, "er", 2), gang.ns)
    job = await gang.running_at("er", 0, 3)
    assert job["status"]["worldSize"] == 3
    before = uids(await gang.pods("er"))
    assert set(before) == {"er-leader-0", "er-worker-0", "er-worker-1"}
    client = AsyncClient(gang.kube, gang.ns)

    # Grow the role 2 -> 3 (`gangjob scale`): one new pod, the others restart in place, and
    # the leader's trainer too learns the new WORLD_SIZE. The job moves on between the
    # client's read and its write (as the controller's status writes do): the conditional
    # patch of the roles conflicts, and the client reads again.
    read = client.get_raw
    reads = 0

    async def read_then_moved(name: str, *, namespace: str | None = None) -> JsonDict:
        nonlocal reads
        reads += 1
        raw = await read(name, namespace=namespace)
        if reads == 1:
            note = {"metadata": {"annotations": {"moved": "yes"}}}
            await gang.kube.patch(GANGJOBS, name, note, gang.ns)
        return raw

    client.get_raw = read_then_moved  # type: ignore[method-assign]
    await client.scale("er", 3)
    assert reads == 2
    job = await gang.running_at("er", 1, 4)
    last = job["status"]["lastRestart"]
    assert last["trigger"]["detail"] == "resized 3 -> 4 (replicas changed)"
    after = uids(await gang.pods("er"))
    assert {n: after[n] for n in before} == before
    assert set(after) == {*before, "er-worker-2"}
    await gang.agents_at(1, list(after))
    ranks = {"er-leader-0": 0, "er-worker-0": 1, "er-worker-1": 2, "er-worker-2": 3}
    for name, rank in ranks.items():
        assert world_seen(gang.sim, name, "Process") == {
            "GANGJOB_EPOCH": "1", "RANK": str(rank), "WORLD_SIZE": "4", "PET_NNODES": "4",
        }  # fmt: skip

    # Shrink it 3 -> 1: its highest workers go; the leader and worker 0 stay, in place.
    done = await client.scale("er", 1, wait=True, timeout=60)
    assert done.resource.status.world_size == 2
    kept = {n: before[n] for n in ("er-leader-0", "er-worker-0")}
    assert uids(await only_pods(gang, "er", set(kept))) == kept
    await gang.agents_at(2, list(kept))
    assert world_seen(gang.sim, "er-worker-0", "Process")["WORLD_SIZE"] == "2"

    # The apiserver: the elastic role within its bounds, every other role fixed.
    job = await gang.kube.get(GANGJOBS, "er", gang.ns)
    refusals = {
        "spec.roles[].replicas is immutable unless the role's elastic is set": (0, "replicas", 2),
        "replicas must be within the role's elastic.minReplicas..elastic.maxReplicas": (
            1, "replicas", 5,
        ),
        "spec.roles[].template is immutable": (
            0, "template", {**job["spec"]["roles"][0]["template"], "metadata": {"labels": {}}},
        ),
    }  # fmt: skip
    for message, (index, field, value) in refusals.items():
        roles = copy.deepcopy(job["spec"]["roles"])
        roles[index][field] = value
        with pytest.raises(Invalid) as caught:
            await gang.kube.patch(GANGJOBS, "er", {"spec": {"roles": roles}}, gang.ns)
        assert message in str(caught.value), caught.value
        assert f"spec.roles[{index}].{field}" in str(caught.value), caught.value
    with pytest.raises(Invalid) as caught:
        await gang.kube.patch(GANGJOBS, "er", {"spec": {"roles": job["spec"]["roles"][1:]}},
                              gang.ns)  # fmt: skip
    assert "spec.roles is immutable (but an elastic role's replicas)" in str(caught.value)


async def test_an_elastic_role_that_is_not_last_is_refused_at_admission(
    gang: Gang,  # noqa: F811 (the fixture)
) -> None:
    body = _roles_body(gang, "first", 2)
    body["spec"]["roles"].reverse()
    body["spec"]["roles"][1]["elastic"] = {"minReplicas": 1, "maxReplicas": 1}
    with pytest.raises(Invalid) as caught:
        await gang.kube.create(GANGJOBS, body, gang.ns)
    assert "only the last role of spec.roles may be elastic" in str(caught.value)
    assert "spec.roles" in str(caught.value)
    body = _roles_body(gang, "onspec", 2)
    body["spec"]["elastic"] = body["spec"]["roles"][1].pop("elastic")
    with pytest.raises(Invalid) as caught:
        await gang.kube.create(GANGJOBS, body, gang.ns)
    assert "elastic: with spec.roles, set elastic on the role that resizes" in str(caught.value)
