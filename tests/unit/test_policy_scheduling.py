"""Unit tests of `controller.policy.scheduling` through `plan` (docs/scheduling.md): the
`GangScheduling` condition in each case, the Workload and PodGroup made before the workers and
every new worker linked to it, a worker recreated after node loss joining the same PodGroup,
and a gang running outside a PodGroup left so."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from api.builders import gangjob, role
from api.constants import ConditionType
from api.v1alpha1 import GangJob, GangJobStatus, parse_gangjob
from controller.policy.plan import EventSpec, Observed, PlanConfig, plan
from controller.policy.scheduling import build_pod_group, build_workload, pod_group_name
from controller.policy.views import PodView
from tests.unit.builders import JOB_NAME, JOB_UID, NAMESPACE, TEMPLATE, make_job, make_node
from tests.unit.gangs import carry_out, condition, gang, names, observe, worker
from tests.unit.test_plan import worlds

SERVED = PlanConfig(pod_groups_served=True)
NOT_SERVED = PlanConfig(pod_groups_served=False)


def linked(pod: dict[str, object], group: str = f"{JOB_NAME}-of-3") -> dict[str, object]:
    pod["spec"]["schedulingGroup"] = {"podGroupName": group}  # type: ignore[index]
    return pod


def test_a_new_gang_gets_a_workload_then_a_pod_group_and_every_worker_is_linked() -> None:
    result = plan(observe(make_job(replicas=3)), SERVED)
    assert names(result) == ["llama-0", "llama-1", "llama-2"]
    for pod in result.create_pods:
        assert pod["spec"]["schedulingGroup"] == {"podGroupName": "llama-of-3"}
    workload, group = result.create_workload, result.create_pod_group
    assert workload is not None
    assert group is not None
    assert workload["spec"]["podGroupTemplates"] == [
        {"name": "workers", "schedulingPolicy": {"gang": {"minCount": 3}}}
    ]
    assert workload["spec"]["controllerRef"] == {
        "apiGroup": "gangjob.io",
        "kind": "GangJob",
        "name": JOB_NAME,
    }
    assert workload["metadata"]["name"] == "llama-of-3"
    assert group["metadata"]["name"] == "llama-of-3"
    assert group["spec"] == {
        "podGroupTemplateRef": {
            "workload": {"workloadName": "llama-of-3", "podGroupTemplateName": "workers"}
        },
        "schedulingPolicy": {"gang": {"minCount": 3}},
    }
    for obj in (workload, group):
        (ref,) = obj["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["uid"], ref["controller"]) == ("GangJob", JOB_UID, True)
    assert condition(result, ConditionType.GANG_SCHEDULING) == (
        "True",
        "PodGroupGangPolicy",
        "Workers are placed all-or-nothing through PodGroup llama-of-3 (minCount 3)",
    )
    assert result.events == [EventSpec("Normal", "WorkersCreated", "Created 3 worker pod(s)")]


def test_off_links_nothing_and_says_so_without_an_event() -> None:
    job = make_job(replicas=2, scheduling={"gang": "Off"})
    result = plan(observe(job), SERVED)
    assert names(result) == ["llama-0", "llama-1"]
    assert all("schedulingGroup" not in pod["spec"] for pod in result.create_pods)
    assert result.create_workload is None
    assert result.create_pod_group is None
    cond = condition(result, ConditionType.GANG_SCHEDULING)
    assert cond is not None
    assert cond[:2] == ("False", "GangSchedulingOff")
    assert [e.reason for e in result.events] == ["WorkersCreated"]


def test_an_api_not_served_is_said_once_and_the_gang_runs_as_without() -> None:
    observed = observe(make_job(replicas=2))
    result = plan(observed, NOT_SERVED)
    assert names(result) == ["llama-0", "llama-1"]
    assert all("schedulingGroup" not in pod["spec"] for pod in result.create_pods)
    assert result.create_workload is None
    assert result.create_pod_group is None
    cond = condition(result, ConditionType.GANG_SCHEDULING)
    assert cond is not None
    assert cond[:2] == ("False", "PodGroupAPINotServed")
    assert "scheduling.k8s.io/v1alpha2" in cond[2]
    warnings = [e for e in result.events if e.type == "Warning"]
    assert [e.reason for e in warnings] == ["PodGroupAPINotServed"]
    # Planned again over its outcome (and again after a worker is lost): no second Event.
    again = plan(carry_out(observed, result), NOT_SERVED)
    assert again.events == []
    assert again.status == result.status


def test_undiscovered_leaves_gang_scheduling_alone() -> None:
    result = plan(observe(make_job(replicas=2)))
    assert condition(result, ConditionType.GANG_SCHEDULING) is None
    assert result.create_pod_group is None
    assert all("schedulingGroup" not in pod["spec"] for pod in result.create_pods)


def test_a_worker_recreated_after_node_loss_joins_the_same_pod_group() -> None:
    pods = [linked(worker(0, 0)), linked(worker(1, 0, node="node-1")), linked(worker(2, 0))]
    nodes = [
        make_node(),
        make_node("node-1", ready="Unknown", taints=("node.kubernetes.io/unreachable",)),
    ]
    observed = gang(pods=pods, nodes=nodes)
    first = plan(observed, SERVED)
    assert [d.name for d in first.delete_pods] == ["llama-1"]
    # The lost worker's pod is gone: the next pass creates it again, in the gang's PodGroup,
    # which bound workers 0 and 2 already count towards (the scheduler's quorum is minCount).
    after = carry_out(observed, first)
    after = dataclasses.replace(after, pods=[p for p in after.pods if p.name != "llama-1"])
    second = plan(after, SERVED)
    assert names(second) == ["llama-1"]
    assert second.create_pods[0]["spec"]["schedulingGroup"] == {"podGroupName": "llama-of-3"}
    assert second.create_pod_group == build_pod_group(after.job)
    assert second.create_workload == build_workload(after.job)
    cond = condition(second, ConditionType.GANG_SCHEDULING)
    assert cond is not None
    assert cond[0] == "True"


def test_a_gang_running_outside_a_pod_group_gets_no_link_for_its_new_worker() -> None:
    observed: Observed = gang(pods=[worker(0, 0), worker(2, 0)])
    result = plan(observed, SERVED)
    assert names(result) == ["llama-1"]
    assert "schedulingGroup" not in result.create_pods[0]["spec"]
    assert result.create_pod_group is None
    cond = condition(result, ConditionType.GANG_SCHEDULING)
    assert cond is not None
    assert cond[:2] == ("False", "WorkersOutsidePodGroup")
    assert "outside PodGroup llama-of-3" in cond[2]


def test_a_pod_view_reads_its_pod_group() -> None:
    assert PodView.from_pod(linked(worker(0, 0), "g")).pod_group == "g"
    assert PodView.from_pod(worker(0, 0)).pod_group is None


def test_a_new_gang_with_no_status_yet_is_linked_whole() -> None:
    observed = gang(replicas=2, status=GangJobStatus(), pods=[])
    result = plan(observed, SERVED)
    assert [p["spec"]["schedulingGroup"]["podGroupName"] for p in result.create_pods] == [
        "llama-of-2",
        "llama-of-2",
    ]


def test_a_resized_gang_keeps_new_workers_out_of_the_new_pod_group() -> None:
    # Linked to the PodGroup of 3 (minCount 3), the gang is now of 4: the new PodGroup's quorum
    # would count the new worker alone, so it is not linked.
    observed = gang(replicas=4, pods=[linked(worker(r, 0)) for r in range(3)])
    result = plan(observed, SERVED)
    assert names(result) == ["llama-3"]
    assert "schedulingGroup" not in result.create_pods[0]["spec"]
    assert result.create_pod_group is None
    cond = condition(result, ConditionType.GANG_SCHEDULING)
    assert cond is not None
    assert cond[:2] == ("False", "WorkersOutsidePodGroup")
    assert "outside PodGroup llama-of-4" in cond[2]


@settings(max_examples=200)
@given(worlds(), st.sampled_from([SERVED, NOT_SERVED, PlanConfig()]))
def test_gang_scheduling_is_idempotent_and_links_all_new_workers_or_none(
    observed: Observed, config: PlanConfig
) -> None:
    first = plan(observed, config)
    groups = {p["spec"].get("schedulingGroup", {}).get("podGroupName") for p in first.create_pods}
    assert len(groups) <= 1
    if groups - {None}:
        assert groups == {pod_group_name(observed.job)}
        assert first.create_pod_group == build_pod_group(observed.job)
        assert first.create_workload == build_workload(observed.job)
    else:
        assert first.create_pod_group is None
        assert first.create_workload is None
    second = plan(carry_out(observed, first), config)
    assert second.events == []
    assert second.status == first.status


def test_roles_that_start_in_order_are_not_gang_scheduled() -> None:
    """A role that waits for another (`dependsOn`) makes the gang never whole at once: a
    PodGroup of all its workers would hold the first role's pods for ever."""

    def job(depends: bool) -> GangJob:
        roles = [
            role("init", 1, TEMPLATE, ranked=False),
            role("worker", 2, TEMPLATE, depends_on=[("init", "Complete")] if depends else []),
        ]
        body = gangjob(JOB_NAME, None, namespace=NAMESPACE, spec={"roles": roles})
        body["metadata"].update(uid=JOB_UID, generation=1)
        return parse_gangjob(body)

    ordered = plan(observe(job(True)), SERVED)
    assert ordered.create_workload is None
    assert ordered.create_pod_group is None
    assert [p["spec"].get("schedulingGroup") for p in ordered.create_pods] == [None]
    held = condition(ordered, ConditionType.GANG_SCHEDULING)
    assert held is not None
    assert held[:2] == ("False", "RolesStartInOrder")
    together = plan(observe(job(False)), SERVED)
    assert together.create_pod_group is not None
    assert together.create_pod_group["spec"]["schedulingPolicy"] == {"gang": {"minCount": 3}}
    assert {p["spec"]["schedulingGroup"]["podGroupName"] for p in together.create_pods} == {
        f"{JOB_NAME}-of-3"
    }


def test_an_elastic_gang_keeps_one_pod_group_of_quorum_min_replicas_when_it_grows() -> None:
    elastic = {"minReplicas": 2, "maxReplicas": 6}
    first = plan(observe(make_job(replicas=3, elastic=elastic)), SERVED)
    assert first.create_pod_group is not None
    assert first.create_pod_group["metadata"]["name"] == "llama-of-2"
    assert first.create_pod_group["spec"]["schedulingPolicy"] == {"gang": {"minCount": 2}}
    # Grown 3 -> 4: the new worker joins the same group, which the bound three already fill.
    pods = [linked(worker(r, 0), "llama-of-2") for r in range(3)]
    status = GangJobStatus.model_validate(
        {"phase": "Running", "epoch": 0, "barrierEpoch": 0, "worldSize": 3, "mode": "Pod"}
    )
    grown = plan(gang(4, status, pods=pods, elastic=elastic), SERVED)
    assert names(grown) == ["llama-3"]
    assert grown.create_pods[0]["spec"]["schedulingGroup"] == {"podGroupName": "llama-of-2"}
    cond = condition(grown, ConditionType.GANG_SCHEDULING)
    assert cond is not None
    assert cond[:2] == ("True", "PodGroupGangPolicy")
