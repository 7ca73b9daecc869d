"""Gang admission by kube-scheduler itself (KEP-4671, `scheduling.k8s.io/v1alpha2`): whether
the gang is placed all-or-nothing (`spec.scheduling.gang`, the `GangScheduling` condition), the
Workload and PodGroup that ask for it, and the link from every worker pod to the PodGroup.

The whole gang is one PodGroup whose gang policy's `minCount` is its number of workers (every
role's), when all its roles start together; a job whose roles start in order (`dependsOn`) is
never whole at once and is scheduled one by one. The
scheduler's GangScheduling plugin holds every worker at Permit until `minCount` of the group's
pods are assumed or bound, then lets them bind together. Bound pods count towards the quorum,
so a worker recreated after node loss joins the same PodGroup and is scheduled at once beside
the `N - 1` that still run (docs/scheduling.md).

With `spec.scheduling.topologyKey`, the PodGroup (and its Workload template) also carries the
topology constraint `schedulingConstraints.topology: [{key}]` (KEP-5732): the scheduler's
`TopologyPlacementGenerator` places every worker in one domain of that node label, and a
recreated worker in the domain of the workers still bound. Where the cluster keeps it
(`WorkloadAwarePreemption`), the PodGroup asks for `disruptionMode: PodGroup` with the gang's
priority class: the scheduler then preempts the gang whole or not at all, never half of it.
"""

from __future__ import annotations

from typing import Any, Final

from api.constants import (
    GROUP,
    KIND,
    LABEL_NAME,
    REASON_GANG_NOT_SERVED,
    REASON_GANG_OFF,
    REASON_GANG_ORDERED,
    REASON_GANG_POD_GROUP,
    REASON_GANG_TOPOLOGY,
    REASON_GANG_TOPOLOGY_NOT_SERVED,
    REASON_GANG_UNLINKED,
    ConditionType,
)
from api.v1alpha1 import ConditionStatus, GangJob, GangSchedulingMode
from controller.policy import podspec
from controller.policy.conditions import get_condition
from controller.policy.passstate import EventSpec, Pass

SCHEDULING_API_VERSION: Final = "scheduling.k8s.io/v1alpha2"
POD_GROUP_TEMPLATE: Final = "workers"
"""The Workload's one PodGroupTemplate: every worker of the gang."""


def gang_size(job: GangJob) -> int:
    """The PodGroup's quorum: the workers of every role; an elastic gang's `minReplicas` (and
    its other roles' workers), the fewest it runs with, so that a resize keeps its PodGroup
    (its workers, old and new, stay linked to one group, whose bound pods already make the
    quorum), and its spares, which are scheduled with it."""
    elastic = job.spec.elasticity
    if elastic is not None:
        return elastic.min_world + elastic.bounds.spares
    return len(job.spec.workers)


def pod_group_name(job: GangJob) -> str:
    """`<job>-of-<workers>`, and the Workload's name too. The size is in the name because both
    are immutable, with `minCount` in them: a gang resized gets new ones, and its workers still
    linked to the old ones keep new workers out of the new (see `gang_scheduling`)."""
    return f"{job.metadata.name}-of-{gang_size(job)}"


def gang_policy(job: GangJob) -> dict[str, Any]:
    """All-or-nothing for the whole gang."""
    return {"gang": {"minCount": gang_size(job)}}


def constraints(job: GangJob) -> dict[str, Any]:
    """The PodGroup's `schedulingConstraints` for `spec.scheduling.topologyKey` (empty without
    one): all its pods in one domain of that node label."""
    key = job.spec.scheduling.topology_key
    if key is None:
        return {}
    return {"schedulingConstraints": {"topology": [{"key": key}]}}


DISRUPTION_MODE: Final = "PodGroup"
"""A gang is preempted whole or not at all (KEP-4671 workload-aware preemption)."""


def priority_class(job: GangJob) -> str | None:
    """The priority class of the gang: the first role's template that names one."""
    for role in job.spec.effective_roles:
        name = (role.template.get("spec") or {}).get("priorityClassName")
        if isinstance(name, str) and name:
            return name
    return None


def disruption(job: GangJob) -> dict[str, Any]:
    """The PodGroup's `disruptionMode: PodGroup` and the gang's priority class: the scheduler
    preempts the gang only whole, and weighs it by that class (a PodGroup without one has
    priority 0 whatever its pods have)."""
    name = priority_class(job)
    return {"disruptionMode": DISRUPTION_MODE, **({"priorityClassName": name} if name else {})}


def _extra(job: GangJob, topology: bool, whole: bool) -> dict[str, Any]:
    return {**(constraints(job) if topology else {}), **(disruption(job) if whole else {})}


def build_workload(job: GangJob, topology: bool = False, whole: bool = False) -> dict[str, Any]:
    """The Workload `<job>-of-<workers>`: one PodGroupTemplate with the gang policy (and, with
    `topology`, the topology constraint; with `whole`, whole-group disruption and the gang's
    priority class), owned by the GangJob. Its templates are immutable; the PodGroup copies
    them."""
    name = job.metadata.name
    return {
        "apiVersion": SCHEDULING_API_VERSION,
        "kind": "Workload",
        "metadata": {
            "name": pod_group_name(job),
            "namespace": job.metadata.namespace,
            "labels": {LABEL_NAME: name},
            "ownerReferences": [podspec.owner_reference(job)],
        },
        "spec": {
            "controllerRef": {"apiGroup": GROUP, "kind": KIND, "name": name},
            "podGroupTemplates": [
                {
                    "name": POD_GROUP_TEMPLATE,
                    "schedulingPolicy": gang_policy(job),
                    **_extra(job, topology, whole),
                }
            ],
        },
    }


def build_pod_group(job: GangJob, topology: bool = False, whole: bool = False) -> dict[str, Any]:
    """The PodGroup `<job>-of-<workers>` made from the Workload's template, owned by the
    GangJob. The apiserver refuses it (admission `PodGroupWorkloadExists`) until the Workload
    exists."""
    name = job.metadata.name
    return {
        "apiVersion": SCHEDULING_API_VERSION,
        "kind": "PodGroup",
        "metadata": {
            "name": pod_group_name(job),
            "namespace": job.metadata.namespace,
            "labels": {LABEL_NAME: name},
            "ownerReferences": [podspec.owner_reference(job)],
        },
        "spec": {
            "podGroupTemplateRef": {
                "workload": {
                    "workloadName": pod_group_name(job),
                    "podGroupTemplateName": POD_GROUP_TEMPLATE,
                }
            },
            "schedulingPolicy": gang_policy(job),
            **_extra(job, topology, whole),
        },
    }


PROBE_TOPOLOGY_KEY: Final = "kubernetes.io/hostname"
PROBED: Final[dict[str, dict[str, Any]]] = {
    "topology": {"schedulingConstraints": {"topology": [{"key": PROBE_TOPOLOGY_KEY}]}},
    "disruption": {"disruptionMode": DISRUPTION_MODE},
}
"""What a PodGroup template asks that the apiserver keeps only with a feature gate on:
`TopologyAwareWorkloadScheduling`, `WorkloadAwarePreemption`."""


def probe_workload(feature: str) -> dict[str, Any]:
    """A Workload to create as a dry run, to learn whether the apiserver keeps the `PROBED`
    field of `feature`: with its feature gate off it drops the field (or refuses it), and a
    dry run stores nothing either way."""
    return {
        "apiVersion": SCHEDULING_API_VERSION,
        "kind": "Workload",
        "metadata": {"generateName": "gangjob-probe-"},
        "spec": {
            "controllerRef": {"apiGroup": GROUP, "kind": KIND, "name": "gangjob-probe"},
            "podGroupTemplates": [
                {
                    "name": POD_GROUP_TEMPLATE,
                    "schedulingPolicy": {"gang": {"minCount": 1}},
                    **PROBED[feature],
                }
            ],
        },
    }


def keeps(answer: dict[str, Any], feature: str) -> bool:
    """Whether the apiserver's answer to `probe_workload(feature)` still has the field."""
    templates = (answer.get("spec") or {}).get("podGroupTemplates") or [{}]
    return all(templates[0].get(k) == v for k, v in PROBED[feature].items())


def link(pod: dict[str, Any], group: str) -> dict[str, Any]:
    """The worker pod scheduled in PodGroup `group` (`spec.schedulingGroup` is immutable)."""
    pod.setdefault("spec", {})["schedulingGroup"] = {"podGroupName": group}
    return pod


def gang_scheduling(p: Pass) -> bool:
    """Sets the `GangScheduling` condition and, when it is in force and this pass creates
    workers, has the Workload and PodGroup created first and links each new worker to it.

    A gang any of whose live workers runs outside this PodGroup (created before the API was
    served, or with `Off`, or before the gang was resized) gets no link for its new workers
    either: the PodGroup's quorum counts only its own pods, so a replacement linked alone would
    wait for ever.
    """
    if p.config.pod_groups_served is None:
        return False
    group = pod_group_name(p.job)
    mode = p.job.spec.scheduling.gang
    key = p.job.spec.scheduling.topology_key
    # The message names no pod: the workers this pass creates unlinked would change it.
    unlinked = any(pod.pod_group != group for pod in p.staying().values())
    if mode is GangSchedulingMode.OFF:
        status, reason = ConditionStatus.FALSE, REASON_GANG_OFF
        message = "spec.scheduling.gang is Off: workers are scheduled one by one"
    elif not p.config.pod_groups_served:
        status, reason = ConditionStatus.FALSE, REASON_GANG_NOT_SERVED
        message = (
            f"The cluster does not serve {SCHEDULING_API_VERSION} PodGroups (feature gate "
            "GenericWorkload): workers are scheduled one by one"
        )
    elif any(role.depends_on for role in p.job.spec.effective_roles):
        status, reason = ConditionStatus.FALSE, REASON_GANG_ORDERED
        message = (
            "Roles start in order (dependsOn), so the gang is never whole at once: workers are "
            "scheduled one by one"
        )
    elif unlinked:
        status, reason = ConditionStatus.FALSE, REASON_GANG_UNLINKED
        message = (
            f"Workers run outside PodGroup {group}: new workers are scheduled one by one "
            "until the gang is created whole again"
        )
    else:
        status, reason = ConditionStatus.TRUE, REASON_GANG_POD_GROUP
        message = (
            f"Workers are placed all-or-nothing through PodGroup {group} "
            f"(minCount {gang_size(p.job)})"
        )
        topology = key is not None and bool(p.config.pod_group_topology_served)
        if topology:
            reason = REASON_GANG_TOPOLOGY
            message += f", all in one domain of node label {key}"
        elif key is not None:
            reason = REASON_GANG_TOPOLOGY_NOT_SERVED
            message += (
                f"; spec.scheduling.topologyKey {key} is not enforced: the cluster keeps no "
                "PodGroup topology constraint (feature gate TopologyAwareWorkloadScheduling)"
            )
        whole = bool(p.config.pod_group_disruption_served)
        if whole:
            name = priority_class(p.job)
            message += "; preempted only whole" + (f" (priority class {name})" if name else "")
        elif p.config.pod_group_disruption_served is False:
            message += (
                "; preemption may take part of the gang: the cluster keeps no PodGroup "
                "disruptionMode (feature gate WorkloadAwarePreemption)"
            )
        if p.create_pods:
            p.create_workload = build_workload(p.job, topology, whole)
            p.create_pod_group = build_pod_group(p.job, topology, whole)
            for pod in p.create_pods.values():
                link(pod, group)
    if key is not None and status is ConditionStatus.FALSE:
        message += f"; spec.scheduling.topologyKey {key} is not enforced without it"
    held = get_condition(p.status.conditions, ConditionType.GANG_SCHEDULING)
    warned = (REASON_GANG_NOT_SERVED, REASON_GANG_TOPOLOGY_NOT_SERVED)
    if reason in warned and (held is None or held.reason != reason):
        p.events.append(EventSpec("Warning", reason, message))
    p.set_condition(ConditionType.GANG_SCHEDULING, status, reason, message)
    return False
