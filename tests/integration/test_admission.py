"""Bad GangJobs are refused at the door: each manifest of the table is created on the real
apiserver as `kubectl create` does it (server-side dry run, strict field validation) and must be
rejected with a message naming the field and the rule (docs/api.md, "Validation"); the valid
ones (the shorthand, roles, Process mode, hostNetwork one per node, a custom condition) pass.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from api import builders
from localcluster.cluster import Cluster
from localcluster.tools import install_crd, kubectl

pytestmark = pytest.mark.integration

Manifest = dict[str, Any]


def shorthand(**spec: Any) -> Manifest:
    return builders.gangjob("bad", 2, image="busybox", command=["train"], spec=spec)


def roles(**spec: Any) -> Manifest:
    def role(name: str, **fields: Any) -> dict[str, Any]:
        container = {"name": "trainer", "image": "busybox", "command": ["train"]}
        return {"name": name, "replicas": 2, "template": {"spec": {"containers": [container]}},
                **fields}  # fmt: skip

    job = builders.gangjob("bad", None, spec={"roles": [role("init", ranked=False),
                                                         role("worker")]})  # fmt: skip
    job["spec"].update(spec)
    return job


def elastic_roles(**worker: Any) -> Manifest:
    """`roles()` with the first role ranked and the last one elastic (1..4)."""
    job = roles()
    first, last = job["spec"]["roles"]
    first.pop("ranked")
    last.update(elastic={"minReplicas": 1, "maxReplicas": 4}, **worker)
    return job


def trainer(job: Manifest) -> dict[str, Any]:
    template = job["spec"].get("template") or job["spec"]["roles"][1]["template"]
    container: dict[str, Any] = template["spec"]["containers"][0]
    return container


def pod_spec(job: Manifest) -> dict[str, Any]:
    template = job["spec"].get("template") or job["spec"]["roles"][1]["template"]
    spec: dict[str, Any] = template["spec"]
    return spec


def edit(base: Callable[[], Manifest], change: Callable[[Manifest], object]) -> Manifest:
    job = base()
    change(job)
    return job


def _sidecar(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "image": "busybox", **fields}


ANTI_AFFINITY = {
    "podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "kubernetes.io/hostname",
             "labelSelector": {"matchLabels": {"gangjob.io/name": "bad"}}}
        ]
    }
}  # fmt: skip

RESERVED_CONTAINER = "are reserved for the agent containers the controller injects"
RESERVED_VOLUME = "are reserved for the volumes the controller injects"
RESERVED_MOUNT = "/gangjob is reserved for the agent's directory"
RESERVED_PORT = "port 9445 and the name gangjob-agent are reserved for the agent"
HOST_NETWORK = "set a required podAntiAffinity term with topologyKey kubernetes.io/hostname"
TRAINER_RESTARTS = "the trainer container's restartPolicy must be unset or Never"
COMMAND = "the trainer container's command is required with"
CONDITION = "condition type Kubernetes sets"

# (id, manifest, what the message must say: the field, then the rule)
INVALID: list[tuple[str, Manifest, tuple[str, ...]]] = [
    # The pod template is a real PodTemplateSpec: misspelt or mistyped fields are named.
    ("resource-typo", edit(shorthand, lambda j: trainer(j).update(resource={"limits": {
        "nvidia.com/gpu": 1}})), ('unknown field "spec.template.spec.containers[0].resource"',)),
    ("podspec-typo", edit(shorthand, lambda j: pod_spec(j).update(nodeSelecter={"a": "b"})),
     ('unknown field "spec.template.spec.nodeSelecter"',)),
    ("metadata-typo", edit(shorthand, lambda j: j["spec"]["template"].update(metadata={
        "label": {"a": "b"}})), ('unknown field "spec.template.metadata.label"',)),
    ("role-template-typo", edit(roles, lambda j: trainer(j).update(imagePullPolicyy="Always")),
     ('unknown field "spec.roles[1].template.spec.containers[0].imagePullPolicyy"',)),
    ("probe-typo", edit(shorthand, lambda j: trainer(j).update(readinessProbe={"httpGet": {
        "path": "/", "prot": 80}})),
     ('unknown field "spec.template.spec.containers[0].readinessProbe.httpGet.prot"',)),
    ("port-not-integer", edit(shorthand, lambda j: trainer(j).update(ports=[{
        "containerPort": "http"}])),
     ("spec.template.spec.containers[0].ports[0].containerPort", "must be of type integer")),
    ("grace-period-not-integer", edit(shorthand, lambda j: pod_spec(j).update(
        terminationGracePeriodSeconds="30s")),
     ("spec.template.spec.terminationGracePeriodSeconds", "must be of type integer")),
    ("quantity-not-int-or-string", edit(shorthand, lambda j: trainer(j).update(resources={
        "limits": {"cpu": True}})), ("spec.template.spec.containers[0].resources.limits.cpu",)),
    ("no-image", edit(shorthand, lambda j: trainer(j).pop("image")),
     ("spec.template.spec.containers[0].image", "Required value")),
    ("no-containers", edit(shorthand, lambda j: pod_spec(j).update(containers=[])),
     ("spec.template.spec.containers", "should have at least 1 items")),
    ("command-not-a-list", edit(shorthand, lambda j: trainer(j).update(
        command="python train.py")),
     ("spec.template.spec.containers[0].command", "must be of type array")),
    # What the controller adds to every worker pod cannot be in the template.
    ("container-named-agent", edit(shorthand, lambda j: pod_spec(j)["containers"].append(
        _sidecar("gangjob-agent"))), ("spec.template.spec.containers", RESERVED_CONTAINER)),
    ("init-named-agent-install", edit(shorthand, lambda j: pod_spec(j).update(initContainers=[
        _sidecar("gangjob-agent-install")])),
     ("spec.template.spec.initContainers", RESERVED_CONTAINER)),
    ("volume-gangjob", edit(shorthand, lambda j: pod_spec(j).update(volumes=[
        {"name": "gangjob", "emptyDir": {}}])), ("spec.template.spec.volumes", RESERVED_VOLUME)),
    ("volume-arrival-token", edit(roles, lambda j: pod_spec(j).update(volumes=[
        {"name": "gangjob-arrival-token", "emptyDir": {}}])),
     ("spec.roles[1].template.spec.volumes", RESERVED_VOLUME)),
    ("mount-gangjob", edit(shorthand, lambda j: trainer(j).update(volumeMounts=[
        {"name": "data", "mountPath": "/gangjob"}])),
     ("spec.template.spec.containers", RESERVED_MOUNT)),
    ("init-mount-gangjob-slash", edit(shorthand, lambda j: pod_spec(j).update(initContainers=[
        _sidecar("prep", volumeMounts=[{"name": "data", "mountPath": "/gangjob/"}])])),
     ("spec.template.spec.initContainers", RESERVED_MOUNT)),
    ("port-9445", edit(shorthand, lambda j: trainer(j).update(ports=[{"containerPort": 9445}])),
     ("spec.template.spec.containers", RESERVED_PORT)),
    ("port-named-agent", edit(roles, lambda j: trainer(j).update(ports=[
        {"name": "gangjob-agent", "containerPort": 8000}])),
     ("spec.roles[1].template.spec.containers", RESERVED_PORT)),
    ("sidecar-port-9445", edit(shorthand, lambda j: pod_spec(j).update(initContainers=[
        _sidecar("proxy", restartPolicy="Always", ports=[{"containerPort": 9445}])])),
     ("spec.template.spec.initContainers", RESERVED_PORT)),
    # Two workers on one host network would both bind the agent's port.
    ("host-network", edit(shorthand, lambda j: pod_spec(j).update(hostNetwork=True)),
     ("spec.template.spec.hostNetwork", HOST_NETWORK)),
    ("host-network-zone-spread", edit(roles, lambda j: pod_spec(j).update(hostNetwork=True,
        affinity={"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "topology.kubernetes.io/zone"}]}})),
     ("spec.roles[1].template.spec.hostNetwork", HOST_NETWORK)),
    # The controller owns the trainer's restarts.
    ("trainer-restart-always", edit(shorthand, lambda j: trainer(j).update(
        restartPolicy="Always")), ("spec.template.spec.containers", TRAINER_RESTARTS)),
    ("trainer-restart-rules", edit(shorthand, lambda j: trainer(j).update(
        restartPolicy="Never", restartPolicyRules=[{"action": "Restart", "exitCodes": {
            "operator": "In", "values": [42]}}])),
     ("spec.template.spec.containers", TRAINER_RESTARTS)),
    ("role-trainer-restart-always", edit(roles, lambda j: (
        pod_spec(j)["containers"].append(_sidecar("main", restartPolicy="Always")),
        j["spec"]["roles"][1].update(trainerContainer="main"),
    )), ("spec.roles[1].template.spec.containers", TRAINER_RESTARTS)),
    # The agent runs the trainer's command in Process mode and with nprocPerNode.
    ("process-without-command", edit(shorthand, lambda j: (
        trainer(j).pop("command"), j["spec"].update(restart={"mode": "Process"}))),
     ("spec.template", COMMAND, "restart mode Process")),
    ("process-role-without-command", edit(lambda: roles(restart={"mode": "Process"}),
        lambda j: trainer(j).pop("command")), ("spec.roles", COMMAND, "restart mode Process")),
    ("process-trainer-container-without-command", edit(shorthand, lambda j: (
        pod_spec(j)["containers"].append(_sidecar("main")),
        j["spec"].update(trainerContainer="main"),
        j["spec"].update(restart={"mode": "Process"}))),
     ("spec.template", COMMAND, "restart mode Process")),
    ("nproc-without-command", edit(lambda: shorthand(nprocPerNode=8),
        lambda j: trainer(j).pop("command")), ("spec.template", COMMAND, "spec.nprocPerNode")),
    # A misspelt condition type would make a rule that never matches.
    ("pod-condition-typo", shorthand(failurePolicy={"rules": [{"action": "FailJob",
        "onPodConditions": [{"type": "DisruptonTarget"}]}]}),
     ("spec.failurePolicy.rules[0].onPodConditions[0].type", "pod " + CONDITION)),
    ("node-condition-typo", shorthand(failurePolicy={"rules": [{"action": "RestartGang",
        "onNodeConditions": [{"type": "MemoryPresure", "status": "True"}]}]}),
     ("spec.failurePolicy.rules[0].onNodeConditions[0].type", "node " + CONDITION)),
    ("custom-node-condition-unmarked", shorthand(failurePolicy={"rules": [{"action": "Ignore",
        "onNodeConditions": [{"type": "GpuXidError", "status": "True"}]}]}),
     ("spec.failurePolicy.rules[0].onNodeConditions[0].type", "set custom: true")),
    # The GangJob's own fields, as before.
    ("mode-enum", shorthand(restart={"mode": "InPlace"}),
     ("spec.restart.mode", "supported values")),
    ("replicas-zero", edit(shorthand, lambda j: j["spec"].update(replicas=0)),
     ("spec.replicas", "should be greater than or equal to 1")),
    ("trainer-container-unknown", shorthand(trainerContainer="nope"),
     ("spec.trainerContainer", "must name a container of spec.template.spec.containers")),
    ("roles-and-replicas", edit(roles, lambda j: j["spec"].update(replicas=2)),
     ("spec.roles", "set either spec.roles or spec.replicas")),
    # Elastic gangs: bounds, one role, a command.
    ("elastic-above-max", shorthand(elastic={"minReplicas": 1, "maxReplicas": 1}),
     ("spec.replicas", "replicas must be within spec.elastic.minReplicas..")),
    ("elastic-min-above-max", shorthand(elastic={"minReplicas": 3, "maxReplicas": 2}),
     ("spec.elastic.minReplicas", "elastic.minReplicas must be <= elastic.maxReplicas")),
    ("elastic-roles", roles(elastic={"minReplicas": 1, "maxReplicas": 4}),
     ("spec.elastic", "elastic: with spec.roles, set elastic on the role that resizes")),
    ("elastic-role-not-last", edit(elastic_roles, lambda j: j["spec"]["roles"].reverse()),
     ("spec.roles", "only the last role of spec.roles may be elastic")),
    ("elastic-role-beside-unranked", edit(elastic_roles,
        lambda j: j["spec"]["roles"][0].update(ranked=False)),
     ("spec.roles", "every role of a job with an elastic role must be ranked")),
    ("elastic-role-above-max", elastic_roles(replicas=5),
     ("spec.roles[1].replicas", "replicas must be within the role's elastic.minReplicas")),
    ("elastic-role-depends", elastic_roles(dependsOn=[{"role": "init", "status": "Ready"}]),
     ("spec.roles[1].dependsOn", "an elastic role starts with the gang")),
    ("elastic-role-no-command", edit(elastic_roles, lambda j: trainer(j).pop("command")),
     ("spec.roles", COMMAND, "an elastic role (spec.roles[].elastic)")),
    ("elastic-role-spares-recreate", edit(elastic_roles, lambda j: (
        j["spec"]["roles"][1]["elastic"].update(spares=1),
        j["spec"].update(restart={"mode": "Recreate"}))),
     ("spec.roles", "roles[].elastic.spares requires a restart mode that keeps the pods")),
    ("elastic-no-command", edit(lambda: shorthand(elastic={"minReplicas": 1, "maxReplicas": 4}),
                                lambda j: trainer(j).pop("command")),
     ("spec.template", "spec.elastic")),
]  # fmt: skip

VALID: list[tuple[str, Manifest]] = [
    ("shorthand", shorthand()),
    ("elastic", shorthand(elastic={"minReplicas": 1, "maxReplicas": 4, "waitSeconds": 60})),
    ("shorthand-everything", edit(lambda: shorthand(
        restart={"mode": "Process"},
        failurePolicy={"rules": [
            {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget"}]},
            {"action": "Ignore", "onNodeConditions": [{"type": "GpuXidError", "status": "True",
                                                       "custom": True}]},
            {"action": "RestartGang", "onNodeConditions": [{"type": "MemoryPressure",
                                                            "status": "True"}]},
        ]}), lambda j: (
            trainer(j).update(
                restartPolicy="Never", ports=[{"containerPort": 8000, "name": "metrics"}],
                volumeMounts=[{"name": "data", "mountPath": "/gangjob-data"}],
                resources={"limits": {"nvidia.com/gpu": 1, "cpu": "2", "memory": "4Gi"}}),
            pod_spec(j).update(hostNetwork=True, affinity=ANTI_AFFINITY, volumes=[
                {"name": "data", "emptyDir": {}}]),
            j["spec"]["template"].update(metadata={"labels": {"team": "a"}}),
        ))),
    ("roles", roles()),
    ("elastic-role", edit(elastic_roles, lambda j: (
        j["spec"]["roles"][1]["elastic"].update(spares=1),
        j["spec"].update(restart={"mode": "Process"})))),
    ("roles-process", edit(lambda: roles(restart={"mode": "Process"}), lambda j: (
        pod_spec(j)["containers"].insert(0, _sidecar("log")),
        j["spec"]["roles"][1].update(trainerContainer="trainer")))),
]  # fmt: skip


def _create(cluster: Cluster, job: Manifest) -> str:
    """`kubectl create` of `job` as a server-side dry run: '' if accepted, else the error."""
    try:
        kubectl(cluster, "create", "--dry-run=server", "--validate=strict", "-n", "default",
                "-f", "-", stdin=yaml.safe_dump(copy.deepcopy(job)))  # fmt: skip
    except RuntimeError as e:
        return str(e)
    return ""


def test_bad_manifests_are_refused_naming_field_and_rule(sim_cluster: Cluster) -> None:
    install_crd(sim_cluster)
    assert len(INVALID) >= 30
    wrong: dict[str, str] = {}
    for case, job, expected in INVALID:
        error = _create(sim_cluster, job)
        if not error or not all(part in error for part in expected):
            wrong[case] = error or "accepted"
    assert wrong == {}


def test_valid_manifests_are_accepted(sim_cluster: Cluster) -> None:
    install_crd(sim_cluster)
    refused = {case: error for case, job in VALID if (error := _create(sim_cluster, job))}
    assert refused == {}
