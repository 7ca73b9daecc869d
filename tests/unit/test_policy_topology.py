"""`spec.scheduling.topologyKey` through `plan` (docs/scheduling.md): the PodGroup and its
Workload template carry the topology constraint where the cluster keeps it, the
`GangScheduling` condition says where it does not, and `Stuck` says when no domain can ever
hold the gang (`controller.policy.topology`)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from api.constants import ConditionType
from api.v1alpha1 import GangJobStatus
from controller.policy import scheduling, topology
from controller.policy.plan import EventSpec, PlanConfig, plan
from tests.unit.builders import TEMPLATE, make_job, make_node
from tests.unit.gangs import condition, gang, observe

RACK = "topology.kubernetes.io/rack"
KEPT = PlanConfig(pod_groups_served=True, pod_group_topology_served=True)
DROPPED = PlanConfig(pod_groups_served=True, pod_group_topology_served=False)
CONSTRAINT = {"schedulingConstraints": {"topology": [{"key": RACK}]}}


def gpu_template(gpus: int) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus), "cpu": "500m"}
    trainer = {**TEMPLATE["spec"]["containers"][0], "resources": {"limits": limits}}
    return {**TEMPLATE, "spec": {**TEMPLATE["spec"], "containers": [trainer]}}


def racked(name: str, rack: str, gpus: int = 8, *, cordoned: bool = False) -> dict[str, Any]:
    node = make_node(name, labels={RACK: rack}, allocatable={"nvidia.com/gpu": str(gpus)})
    node["spec"]["unschedulable"] = cordoned
    return node


NODES = (racked("n0", "a"), racked("n1", "a"), racked("n2", "b"), racked("n3", "b"))


def test_the_pod_group_and_workload_carry_the_constraint() -> None:
    job = make_job(replicas=3, scheduling={"topologyKey": RACK})
    result = plan(observe(job), KEPT)
    assert result.create_pod_group is not None
    assert result.create_workload is not None
    assert (
        result.create_pod_group["spec"]["schedulingConstraints"]
        == CONSTRAINT["schedulingConstraints"]
    )
    (template,) = result.create_workload["spec"]["podGroupTemplates"]
    assert template == {
        "name": "workers",
        "schedulingPolicy": {"gang": {"minCount": 3}},
        **CONSTRAINT,
    }
    assert condition(result, ConditionType.GANG_SCHEDULING) == (
        "True",
        "PodGroupTopology",
        "Workers are placed all-or-nothing through PodGroup llama-of-3 (minCount 3), all in "
        f"one domain of node label {RACK}",
    )
    assert result.events[-1:] != [EventSpec("Warning", "TopologyNotServed", "")]


def test_without_a_key_nothing_changes() -> None:
    result = plan(observe(make_job(replicas=3)), KEPT)
    assert result.create_pod_group is not None
    assert "schedulingConstraints" not in result.create_pod_group["spec"]


def test_where_the_cluster_drops_the_constraint_the_gang_runs_unconstrained_and_says_so() -> None:
    job = make_job(replicas=3, scheduling={"topologyKey": RACK})
    result = plan(observe(job), DROPPED)
    assert result.create_pod_group is not None
    assert "schedulingConstraints" not in result.create_pod_group["spec"]
    assert len(result.create_pods) == 3
    status, reason, message = condition(result, ConditionType.GANG_SCHEDULING) or ("", "", "")
    assert (status, reason) == ("True", "TopologyNotServed")
    assert "feature gate TopologyAwareWorkloadScheduling" in message
    warnings = [e for e in result.events if e.reason == "TopologyNotServed"]
    assert len(warnings) == 1
    assert warnings[0].type == "Warning"


def test_with_gang_scheduling_off_the_key_is_said_not_enforced() -> None:
    job = make_job(replicas=3, scheduling={"topologyKey": RACK, "gang": "Off"})
    result = plan(observe(job), KEPT)
    found = condition(result, ConditionType.GANG_SCHEDULING)
    assert found is not None
    assert found[2].endswith(f"spec.scheduling.topologyKey {RACK} is not enforced without it")


@pytest.mark.parametrize("key", ["rack!", "/rack", "a/b/c", "x" * 318])
def test_a_bad_label_key_is_refused(key: str) -> None:
    with pytest.raises(ValidationError, match=r"topology_key|topologyKey"):
        make_job(scheduling={"topologyKey": key})


def test_the_gang_needs_are_summed_over_workers_in_whole_numbers() -> None:
    job = make_job(replicas=5, template=gpu_template(4))
    assert topology.gang_requests(job) == {"pods": 5, "nvidia.com/gpu": 20}


def stuck_of(replicas: int, gpus: int, nodes: tuple[dict[str, Any], ...]) -> Any:
    observed = gang(
        replicas=replicas,
        status=GangJobStatus(),
        pods=[],
        nodes=nodes,
        scheduling={"topologyKey": RACK},
        template=gpu_template(gpus),
    )
    result = plan(observed, KEPT)
    # The workers created now are unscheduled: the next pass sees them Pending.
    return condition(result, ConditionType.STUCK)


def test_a_gang_bigger_than_every_domain_is_stuck_saying_why() -> None:
    assert stuck_of(5, 4, NODES) == (
        "True",
        "NoTopologyDomainFits",
        f"The gang needs nvidia.com/gpu 20 in one domain of {RACK} "
        "(spec.scheduling.topologyKey), and no domain has that much allocatable: the largest "
        f"of 2, {RACK}=b (2 nodes), has nvidia.com/gpu 16. Fix: fewer or smaller workers, a "
        "coarser topologyKey, or larger domains.",
    )


def test_a_gang_that_fits_a_domain_is_not_stuck() -> None:
    assert stuck_of(4, 4, NODES) is None


def test_a_cordoned_node_does_not_count() -> None:
    nodes = (racked("n0", "a"), racked("n1", "a", cordoned=True))
    assert stuck_of(2, 8, nodes) is not None
    assert stuck_of(1, 8, nodes) is None


def test_no_labelled_node_is_stuck() -> None:
    found = stuck_of(2, 1, (make_node("n0"),))
    assert found is not None
    assert found[1] == "NoTopologyDomainFits"
    assert found[2].startswith(f"No schedulable node has label {RACK}")


@pytest.mark.parametrize(
    ("feature", "field"), [("topology", "schedulingConstraints"), ("disruption", "disruptionMode")]
)
def test_the_probe_reads_what_the_apiserver_kept(feature: str, field: str) -> None:
    probe = scheduling.probe_workload(feature)
    assert scheduling.keeps(probe, feature)
    (template,) = probe["spec"]["podGroupTemplates"]
    del template[field]
    assert not scheduling.keeps(probe, feature)
