"""The restart mode in effect (`status.mode`): `spec.restart.mode` if the cluster honours it,
else a fallback said in the `ModeDegraded` condition; workers built for another mode are
replaced (docs/design.md sections 3.7 and 3.9)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from api.constants import (
    REASON_MODE_CHANGED,
    REASON_MODE_HONOURED,
    REASON_NODES_LACK_FEATURE,
    REASON_RULES_DROPPED,
    ConditionType,
)
from api.v1alpha1 import Condition, ConditionStatus, GangJob, RestartMode
from controller.policy import nodematch, podspec
from controller.policy.conditions import get_condition
from controller.policy.passstate import EventSpec, Pass, job_for_pods
from controller.policy.views import NodeView, PodView

FEATURE_RESTART_ALL_CONTAINERS: Final = "RestartAllContainersOnContainerExits"
"""What a node declares (`status.declaredFeatures`) when its kubelet does KEP-5532."""


def choose_mode(p: Pass) -> bool:
    """`status.mode`: `spec.restart.mode` if the cluster honours it, else the next mode that
    works, said in the `ModeDegraded` condition (never silently). Workers built for another
    mode are deleted, to be created again in this one."""
    degraded = get_condition(p.conditions, ConditionType.MODE_DEGRADED)
    held = degraded if degraded is not None and degraded.status == ConditionStatus.TRUE else None
    mode, problem = p.job.spec.restart.mode, None
    if mode is RestartMode.POD and held is not None and _fallback_holds(p, held):
        mode, problem = p.mode or _fallback_mode(p), (held.reason, held.message)
    elif mode is RestartMode.POD:
        why = _pod_mode_problem(p)
        if why is not None:
            mode = _fallback_mode(p)
            problem = (why[0], f"{why[1]}: restart mode Pod falls back to {mode}")
    p.mode = mode
    if problem is not None:
        reason, message = problem
        if held is None or held.reason != reason:
            p.events.append(EventSpec("Warning", reason, message))
        p.set_condition(ConditionType.MODE_DEGRADED, ConditionStatus.TRUE, reason, message)
    elif held is not None:
        p.set_condition(
            ConditionType.MODE_DEGRADED,
            ConditionStatus.FALSE,
            REASON_MODE_HONOURED,
            f"Restart mode {mode} is honoured",
        )
    for pod in p.gang.live.values():
        if pod.restart_mode is not None and pod.restart_mode != mode:
            p.delete(pod, REASON_MODE_CHANGED)
    return False


def _fallback_holds(p: Pass, held: Condition) -> bool:
    """Whether a fallback made earlier still holds, whatever the nodes say now."""
    # The apiserver's gates do not change under a running job: once rules were dropped, the
    # fallback holds for the job's life (and would otherwise flap with every new pod).
    if held.reason == REASON_RULES_DROPPED:
        return True
    # A gang that exists keeps the mode it was built in: changing it recreates every worker.
    return p.mode not in (None, RestartMode.POD) and bool(p.gang.workers)


def _pod_mode_problem(p: Pass) -> tuple[str, str] | None:
    """(reason, message) if `Pod` mode cannot work here, else None."""
    stripped = sorted(pod.name for pod in p.gang.workers.values() if _rules_dropped(pod))
    if stripped and _pod_mode_has_rules(p):
        return (
            REASON_RULES_DROPPED,
            f"The apiserver dropped the restartPolicyRules of pod {stripped[0]} (feature gates "
            "ContainerRestartRules/RestartAllContainersOnContainerExits off)",
        )
    if p.mode is RestartMode.POD and p.gang.workers:
        return None  # built in Pod mode already: a node that stops declaring it changes nothing
    if any(
        node.ready == "True" and FEATURE_RESTART_ALL_CONTAINERS in node.declared_features
        for node in eligible_nodes(p.job, p.observed.nodes.values())
    ):
        return None
    return (
        REASON_NODES_LACK_FEATURE,
        f"No Ready node the workers may run on declares {FEATURE_RESTART_ALL_CONTAINERS} "
        "(KEP-5532): a Pod-mode worker could not be scheduled",
    )


def eligible_nodes(job: GangJob, nodes: Iterable[NodeView]) -> list[NodeView]:
    """The nodes some role's template allows by its `nodeSelector` and required node affinity:
    in a mixed cluster only those decide whether `Pod` mode can be scheduled."""
    specs = [role.template.get("spec") or {} for role in job.spec.effective_roles]
    return [n for n in nodes if any(nodematch.allows(spec, n) for spec in specs)]


def _rules_dropped(pod: PodView) -> bool:
    return pod.restart_mode == RestartMode.POD and not pod.has_restart_rules


def _pod_mode_has_rules(p: Pass) -> bool:
    """Whether podspec gives a `Pod`-mode worker restart rules at all: only then does a pod
    without any say that the apiserver dropped them."""
    job = job_for_pods(p, RestartMode.POD)
    try:
        pods = [podspec.build_pod(job, w, p.config.agent_image) for w in _first_of_each_role(job)]
    except ValueError:
        return False
    specs = [pod.get("spec") or {} for pod in pods]
    containers = [
        c for spec in specs for c in (*(spec.get("initContainers") or []), *spec["containers"])
    ]
    return any(c.get("restartPolicyRules") for c in containers)


def _first_of_each_role(job: GangJob) -> list[int]:
    """The first worker of each role: a pod of each template."""
    return [w.worker for w in job.spec.workers if w.index == 0]


def _fallback_mode(p: Pass) -> RestartMode:
    """`Process` needs no KEP-5532; a template it cannot wrap (no `command`) gets `Recreate`,
    which works everywhere."""
    job = job_for_pods(p, RestartMode.PROCESS)
    try:
        for worker in _first_of_each_role(job):
            podspec.build_pod(job, worker, p.config.agent_image)
    except ValueError:
        return RestartMode.RECREATE
    return RestartMode.PROCESS
