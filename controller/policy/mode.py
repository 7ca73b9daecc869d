"""The restart mode in effect (`status.mode`): `spec.restart.mode` if the cluster honours it,
else a fallback said in the `ModeDegraded` condition; workers built for another mode are
replaced (docs/design.md sections 3.7 and 3.9)."""

from __future__ import annotations

from collections.abc import Iterable

from api.constants import (
    REASON_MODE_CHANGED,
    REASON_MODE_HONOURED,
    REASON_NODES_LACK_FEATURE,
    REASON_RULES_DROPPED,
    RESTART_MODES,
    ConditionType,
    RestartMode,
)
from api.v1alpha1 import Condition, ConditionStatus, GangJob
from controller.policy import nodematch, podspec
from controller.policy.conditions import get_condition
from controller.policy.passstate import EventSpec, Pass, job_for_pods
from controller.policy.views import NodeView, PodView


def choose_mode(p: Pass) -> bool:
    """`status.mode`: `spec.restart.mode` if the cluster honours it, else the first of its
    fallbacks (`RESTART_MODES`) that works, said in the `ModeDegraded` condition (never
    silently). Workers built for another mode are deleted, to be created again in this one."""
    degraded = get_condition(p.status.conditions, ConditionType.MODE_DEGRADED)
    held = degraded if degraded is not None and degraded.status == ConditionStatus.TRUE else None
    asked = p.job.spec.restart.mode
    mode, problem = asked, None
    if RESTART_MODES[asked].fallbacks and held is not None and _fallback_holds(p, held, asked):
        mode, problem = p.status.mode or _fallback_mode(p, asked), (held.reason, held.message)
    elif RESTART_MODES[asked].fallbacks:
        why = _mode_problem(p, asked)
        if why is not None:
            mode = _fallback_mode(p, asked)
            problem = (why[0], f"{why[1]}: restart mode {asked} falls back to {mode}")
    p.status.mode = mode
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


def _fallback_holds(p: Pass, held: Condition, asked: RestartMode) -> bool:
    """Whether a fallback made earlier still holds, whatever the nodes say now."""
    # The apiserver's gates do not change under a running job: once rules were dropped, the
    # fallback holds for the job's life (and would otherwise flap with every new pod).
    if held.reason == REASON_RULES_DROPPED:
        return True
    # A gang that exists keeps the mode it was built in: changing it recreates every worker.
    return p.status.mode not in (None, asked) and bool(p.gang.workers)


def _mode_problem(p: Pass, asked: RestartMode) -> tuple[str, str] | None:
    """(reason, message) if `asked` cannot work here, else None: its restart rules dropped by
    the apiserver, or no node declaring the feature it needs."""
    stripped = sorted(pod.name for pod in p.gang.workers.values() if _rules_dropped(pod))
    if stripped and _has_rules(p, asked):
        return (
            REASON_RULES_DROPPED,
            f"The apiserver dropped the restartPolicyRules of pod {stripped[0]} (feature gates "
            "ContainerRestartRules/RestartAllContainersOnContainerExits off)",
        )
    feature = RESTART_MODES[asked].node_feature
    if feature is None or (p.status.mode is asked and p.gang.workers):
        return None  # built in this mode already: a node that stops declaring it changes nothing
    if any(
        node.ready == "True" and feature in node.declared_features
        for node in eligible_nodes(p.job, p.observed.nodes.values())
    ):
        return None
    return (
        REASON_NODES_LACK_FEATURE,
        f"No Ready node the workers may run on declares {feature}: a {asked}-mode worker "
        "could not be scheduled",
    )


def eligible_nodes(job: GangJob, nodes: Iterable[NodeView]) -> list[NodeView]:
    """The nodes some role's template allows by its `nodeSelector` and required node affinity:
    in a mixed cluster only those decide whether `Pod` mode can be scheduled."""
    specs = [role.template.get("spec") or {} for role in job.spec.effective_roles]
    return [n for n in nodes if any(nodematch.allows(spec, n) for spec in specs)]


def _rules_dropped(pod: PodView) -> bool:
    """A pod built for a mode with restart rules shows none."""
    built_for = pod.restart_mode
    if built_for is None or built_for not in RESTART_MODES:
        return False
    return RESTART_MODES[RestartMode(built_for)].restart_rules and not pod.has_restart_rules


def _has_rules(p: Pass, mode: RestartMode) -> bool:
    """Whether podspec gives a worker of `mode` restart rules at all: only then does a pod
    without any say that the apiserver dropped them."""
    job = job_for_pods(p, mode)
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


def _fallback_mode(p: Pass, asked: RestartMode) -> RestartMode:
    """The first of `asked`'s fallbacks whose pods can be built (`Process` needs no KEP-5532,
    but a template it cannot wrap, without `command`, gets the last, `Recreate`, which works
    everywhere)."""
    *tried, last = RESTART_MODES[asked].fallbacks
    for mode in tried:
        job = job_for_pods(p, mode)
        try:
            for worker in _first_of_each_role(job):
                podspec.build_pod(job, worker, p.config.agent_image)
        except ValueError:
            continue
        return mode
    return last
