"""What a worker pod carries to be admitted by Kueue as one pod group with the rest of its gang.

A GangJob labelled `kueue.x-k8s.io/queue-name` asks Kueue for quota. Kueue's pod-group
integration needs no code of ours: every worker carries the queue name, the group's name (the
GangJob's) and the group's size; Kueue's webhook gates each pod until the group, counted whole,
is admitted as one Workload, then ungates them together. A replacement worker (node or device
loss) carries the same group, in the group's shape, and joins the admitted Workload (kept off
nodes by `lifecycle.place`, which Kueue's role hash allows). The group is every worker of every
role; Kueue admits it only once all of them exist, so roles that start in order (`dependsOn`)
do not go with a queue (docs/scheduling.md). Pure: no I/O.
"""

from __future__ import annotations

from api.constants import (
    KUEUE_POD_GROUP_NAME_LABEL,
    KUEUE_POD_GROUP_TOTAL_COUNT_ANNOTATION,
    KUEUE_QUEUE_NAME_LABEL,
)
from api.v1alpha1 import GangJob


def queue_name(job: GangJob) -> str | None:
    """The Kueue LocalQueue the GangJob names, or None when Kueue is not asked."""
    return job.metadata.labels.get(KUEUE_QUEUE_NAME_LABEL) or None


def pod_group_metadata(job: GangJob) -> tuple[dict[str, str], dict[str, str]]:
    """(labels, annotations) every worker of `job` gets for Kueue; both empty when the GangJob
    names no queue. The group is the GangJob's name: one Workload per gang, whatever the
    restarts, and a recreated worker is a member of it."""
    queue = queue_name(job)
    if queue is None:
        return {}, {}
    labels = {KUEUE_QUEUE_NAME_LABEL: queue, KUEUE_POD_GROUP_NAME_LABEL: job.metadata.name}
    annotations = {KUEUE_POD_GROUP_TOTAL_COUNT_ANNOTATION: str(len(job.spec.workers))}
    return labels, annotations
