"""Unit tests of `controller.policy.mode` through `plan` (docs/design.md sections 3.7 and 3.9):
`Pod` mode where the nodes the workers may run on declare KEP-5532, else the fallback to
`Process` or `Recreate`, said in `ModeDegraded`, and sticky while the gang exists."""

from __future__ import annotations

import copy

from api.constants import ConditionType
from api.v1alpha1 import (
    RestartMode,
)
from controller.policy.plan import EventSpec, Observed, plan
from controller.policy.views import NodeView
from tests.unit.builders import TEMPLATE, make_node, with_status
from tests.unit.gangs import (
    carry_out,
    condition,
    new_gang,
)


def test_pod_mode_when_a_ready_node_declares_the_feature() -> None:
    result = plan(new_gang([make_node("old", features=()), make_node()]))
    assert result.status.mode is RestartMode.POD
    assert condition(result, ConditionType.MODE_DEGRADED) is None
    assert result.create_pods[0]["metadata"]["annotations"]["gangjob.io/restart-mode"] == "Pod"


def test_only_the_nodes_the_template_selects_decide_the_mode() -> None:
    # A mixed cluster: the declaring node is not one the template's nodeSelector allows.
    other = make_node("cpu-pool", labels={"pool": "cpu"})
    result = plan(new_gang([other, make_node("gpu-old", features=())]))
    assert result.status.mode is RestartMode.PROCESS
    reason = condition(result, ConditionType.MODE_DEGRADED)
    assert reason is not None
    assert reason[1] == "NodesLackRestartAllContainers"
    # ... and a selected node that declares it keeps Pod mode.
    result = plan(new_gang([other, make_node("gpu-new")]))
    assert result.status.mode is RestartMode.POD


def test_process_mode_when_no_ready_node_declares_the_feature() -> None:
    observed = new_gang([make_node("old", features=()), make_node(ready="False")])
    result = plan(observed)
    message = (
        "No Ready node the workers may run on declares RestartAllContainersOnContainerExits: "
        "a Pod-mode worker could not be scheduled: restart mode Pod falls back to Process"
    )
    assert result.status.mode is RestartMode.PROCESS
    assert condition(result, ConditionType.MODE_DEGRADED) == (
        "True",
        "NodesLackRestartAllContainers",
        message,
    )
    assert EventSpec("Warning", "NodesLackRestartAllContainers", message) in result.events
    pod = result.create_pods[0]
    assert pod["metadata"]["annotations"]["gangjob.io/restart-mode"] == "Process"
    assert pod["spec"]["containers"][0]["command"][:4] == [
        "python3",
        "/gangjob/agent.pyz",
        "wrap",
        "--",
    ]
    # The fallback holds while the gang exists, even once a node declares the feature.
    after = carry_out(observed, result)
    nodes = {"n": NodeView.from_node(make_node("n"))}
    later = plan(Observed(after.job, after.pods, nodes, True, after.now))
    assert later.status.mode is RestartMode.PROCESS
    assert later.events == []
    assert later.delete_pods == []


def test_recreate_mode_when_process_mode_cannot_wrap_the_trainer() -> None:
    observed = new_gang([make_node(features=())])
    job = observed.job
    template = job.spec.effective_roles[0].template
    del template["spec"]["containers"][0]["command"]
    result = plan(observed)
    assert result.status.mode is RestartMode.RECREATE
    degraded = condition(result, ConditionType.MODE_DEGRADED)
    assert degraded is not None
    assert degraded[2].endswith("falls back to Recreate")


def test_rules_dropped_by_the_apiserver_fall_back_and_replace_the_pods() -> None:
    observed = new_gang([make_node()])
    created = plan(observed)
    assert created.status.mode is RestartMode.POD
    # The apiserver stripped every restartPolicyRules from what was created.
    for pod in created.create_pods:
        for key in ("initContainers", "containers"):
            for container in pod["spec"].get(key, []):
                container.pop("restartPolicyRules", None)
    after = carry_out(observed, created)
    result = plan(after)
    assert result.status.mode is RestartMode.PROCESS
    reason = condition(result, ConditionType.MODE_DEGRADED)
    assert reason is not None
    assert reason[:2] == ("True", "RestartRulesDropped")
    assert sorted(d.name for d in result.delete_pods) == ["llama-0", "llama-1"]
    assert {d.reason for d in result.delete_pods} == {"RestartModeChanged"}
    # Sticky: with the pods gone and nodes that declare the feature, Process it stays.
    gone = plan(Observed(with_status(after.job, result.status), [], after.nodes, True, after.now))
    assert gone.status.mode is RestartMode.PROCESS
    assert [p["metadata"]["annotations"]["gangjob.io/restart-mode"] for p in gone.create_pods] == [
        "Process",
        "Process",
    ]


def test_modes_other_than_pod_need_no_feature() -> None:
    for mode in ("Process", "Recreate"):
        result = plan(new_gang([make_node(features=())], restart={"mode": mode}))
        assert result.status.mode == mode
        assert condition(result, ConditionType.MODE_DEGRADED) is None


def test_the_required_node_affinity_of_the_template_decides_the_mode_too() -> None:
    # Only the old pool may take the workers (affinity, no nodeSelector): Pod mode cannot be
    # scheduled even though another node declares the feature.
    old = make_node("gpu-old", features=(), labels={"pool": "old"})
    new = make_node("gpu-new", labels={"pool": "new"})
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["old"]}]}
                ]
            }
        }
    }
    template = copy.deepcopy(TEMPLATE)
    template["spec"].pop("nodeSelector")
    template["spec"]["affinity"] = affinity
    result = plan(new_gang([old, new], template=template))
    assert result.status.mode is RestartMode.PROCESS
    reason = condition(result, ConditionType.MODE_DEGRADED)
    assert reason is not None
    assert reason[1] == "NodesLackRestartAllContainers"
    # Allow the new pool as well: it declares the feature, so Pod mode holds.
    terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    terms["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] = ["old", "new"]
    result = plan(new_gang([old, new], template=template))
    assert result.status.mode is RestartMode.POD
