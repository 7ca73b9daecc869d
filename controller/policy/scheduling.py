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
    """The workers of every role: the PodGroup's quorum."""
    return len(job.spec.workers)


def pod_group_name(job: GangJob) -> str:
    """`<job>-of-<workers>`, and the Workload's name too. The size is in the name because both
    are immutable, with `minCount` in them: a gang resized gets new ones, and its workers still
    linked to the old ones keep new workers out of the new (see `gang_scheduling`)."""
    return f"{job.metadata.name}-of-{gang_size(job)}"


def gang_policy(job: GangJob) -> dict[str, Any]:
    """All-or-nothing for the whole gang."""
    return {"gang": {"minCount": gang_size(job)}}


def build_workload(job: GangJob) -> dict[str, Any]:
    """The Workload `<job>-of-<workers>`: one PodGroupTemplate with the gang policy, owned by
    the GangJob. Its templates are immutable; the PodGroup copies the policy from it."""
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
                {"name": POD_GROUP_TEMPLATE, "schedulingPolicy": gang_policy(job)}
            ],
        },
    }


def build_pod_group(job: GangJob) -> dict[str, Any]:
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
        },
    }


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
        if p.create_pods:
            p.create_workload = build_workload(p.job)
            p.create_pod_group = build_pod_group(p.job)
            for pod in p.create_pods.values():
                link(pod, group)
    held = get_condition(p.status.conditions, ConditionType.GANG_SCHEDULING)
    if reason == REASON_GANG_NOT_SERVED and (held is None or held.reason != reason):
        p.events.append(EventSpec("Warning", reason, message))
    p.set_condition(ConditionType.GANG_SCHEDULING, status, reason, message)
    return False
