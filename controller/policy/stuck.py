"""Why a gang cannot make progress, said on the GangJob: the `Stuck` condition (the first cause
that applies, with the workers concerned and the fix) and a Warning Event when it turns True or
its cause changes; `ArrivalDegraded` when agents arrive by annotation although the controller
serves the arrival endpoint (docs/design.md section 3.11).

One condition per job, whatever the number of workers: messages name at most `SHOWN` workers
and count the rest, and carry nothing that changes from pass to pass (no elapsed times), so a
gang stuck for an hour is written once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from typing import Final

from api.constants import (
    AGENT_CONTAINER,
    AGENT_INSTALL_CONTAINER,
    ANNOTATION_EPOCH,
    REASON_AGENT_CRASHING,
    REASON_AGENT_IMAGE_PULL,
    REASON_ARRIVAL_UNREACHABLE,
    REASON_ARRIVALS_DIRECT,
    REASON_BARRIER_STALLED,
    REASON_ELASTIC_AT_MINIMUM,
    REASON_IMAGE_PULL,
    REASON_POD_CREATION_REFUSED,
    REASON_PROGRESSING,
    REASON_WORKER_RBAC_MISSING,
    RESTART_EXIT_CODE,
    WORKER_ROLE_FILE,
    WORKER_SERVICE_ACCOUNT,
    ConditionType,
)
from api.v1alpha1 import ConditionStatus, GangJob
from controller.policy import topology
from controller.policy.classify import RESTARTING_ALL_CONTAINERS
from controller.policy.conditions import get_condition, is_true
from controller.policy.gang import POD_TERMINAL, unschedulable_since
from controller.policy.passstate import EventSpec, Pass, worker_text
from controller.policy.views import ContainerView, PodView, parse_decimal_int

SHOWN: Final = 3
"""Workers a message names before it counts the rest."""
MESSAGE_LIMIT: Final = 2000
"""An API error quoted in a message is cut here: the GangJob reaches every agent."""

IMAGE_PULL_REASONS: Final = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "RegistryUnavailable",
        "SignatureValidationFailed",
    }
)
"""A waiting container's reason, as the kubelet writes it, when its image cannot be had."""
CRASH_LOOP: Final = "CrashLoopBackOff"
AGENT_CONTAINERS: Final = frozenset({AGENT_CONTAINER, AGENT_INSTALL_CONTAINER})


Cause = tuple[str, str]
"""(reason, message) of `Stuck`."""


def service_accounts(job: GangJob) -> tuple[str, ...]:
    """The ServiceAccounts the job's agents run as: the templates' own, else the one the
    controller creates and binds (controller.workeraccess)."""
    names: list[str] = []
    for role in job.spec.effective_roles:
        spec = role.template.get("spec") or {}
        name = spec.get("serviceAccountName") or spec.get("serviceAccount")
        name = name if isinstance(name, str) and name else WORKER_SERVICE_ACCOUNT
        if name not in names:
            names.append(name)
    return tuple(names)


def diagnose(p: Pass) -> bool:
    """Sets `Stuck` (and `ArrivalDegraded`) from this pass's view; never ends the pass."""
    cause = _first(
        p,
        (
            creation_refused,
            topology.no_domain_fits,
            rbac_missing,
            image_pull_failed,
            agent_crashing,
            elastic_at_minimum,
            barrier_stalled,
        ),
    )
    stuck = get_condition(p.status.conditions, ConditionType.STUCK)
    if cause is not None:
        reason, message = cause
        if stuck is None or stuck.status != ConditionStatus.TRUE or stuck.reason != reason:
            p.events.append(EventSpec("Warning", reason, message))
        p.set_condition(ConditionType.STUCK, ConditionStatus.TRUE, reason, message)
    elif stuck is not None and stuck.status == ConditionStatus.TRUE:
        p.set_condition(
            ConditionType.STUCK,
            ConditionStatus.FALSE,
            REASON_PROGRESSING,
            f"No longer stuck ({stuck.reason} cleared)",
        )
    _arrival_channel(p)
    if cause is not None or p.status.barrier_epoch != p.status.epoch:
        p.requeue(p.config.recheck_seconds)
    return False


def clear(p: Pass, reason: str, message: str) -> None:
    """A job that finished or was suspended is no longer stuck."""
    if is_true(p.status.conditions, ConditionType.STUCK):
        p.set_condition(ConditionType.STUCK, ConditionStatus.FALSE, reason, message)


def _first(p: Pass, checks: Iterable[Callable[[Pass], Cause | None]]) -> Cause | None:
    for check in checks:
        cause = check(p)
        if cause is not None:
            return cause
    return None


def creation_refused(p: Pass) -> Cause | None:
    """This pass creates worker pods, and the apiserver refused the last attempt."""
    refused = p.observed.creation_refused
    if refused is None or not p.create_pods:
        return None
    if "exceeded quota" in refused:
        fix = "raise the namespace's ResourceQuota or lower the template's requests"
    elif "admission webhook" in refused or "ValidatingAdmissionPolicy" in refused:
        fix = "change the template, or the admission webhook or policy that denies it"
    else:
        fix = "change what the message names (the template, a quota or an admission policy)"
    return (
        REASON_POD_CREATION_REFUSED,
        f"Creating {len(p.create_pods)} worker pod(s) is refused: {_cut(refused)}. "
        f"Fix: {fix}; the controller keeps trying.",
    )


def rbac_missing(p: Pass) -> Cause | None:
    """The agents' ServiceAccount may not read their pod and GangJob or annotate their pod."""
    ns = p.job.metadata.namespace
    for sa in service_accounts(p.job):
        denied = p.observed.denied.get(sa)
        if not denied:
            continue
        if sa == WORKER_SERVICE_ACCOUNT:
            fix = (
                f"install the ClusterRole {WORKER_SERVICE_ACCOUNT} ({WORKER_ROLE_FILE}; "
                "`make install` applies it); the controller binds it in this namespace "
                f"(RoleBinding {WORKER_SERVICE_ACCOUNT})"
            )
        else:
            fix = (
                f"bind the ClusterRole {WORKER_SERVICE_ACCOUNT} ({WORKER_ROLE_FILE}) to "
                f"ServiceAccount {ns}/{sa} with a RoleBinding in this namespace"
            )
        return (
            REASON_WORKER_RBAC_MISSING,
            f"The agents run as ServiceAccount {ns}/{sa}, which may not {', '.join(denied)}: "
            "they get 403 reading their pod and GangJob, and cannot arrive. "
            f"Fix: {fix}.",
        )
    return None


def image_pull_failed(p: Pass) -> Cause | None:
    """A container of a worker waits for an image the kubelet cannot pull; the agent's first."""
    hits = _containers(p, lambda c: c.state == "waiting" and c.reason in IMAGE_PULL_REASONS)
    if not hits:
        return None
    agent = [(w, pod, c) for w, pod, c in hits if c.name in AGENT_CONTAINERS]
    worker, _, container = (agent or hits)[0]
    count = len({w for w, _, _ in (agent or hits)})
    detail = f"{container.reason}" + (f": {_cut(container.message)}" if container.message else "")
    where = f"container {container.name} of {worker_text(p, worker)}"
    more = f" (and {count - 1} more worker(s))" if count > 1 else ""
    if agent:
        return (
            REASON_AGENT_IMAGE_PULL,
            f"The agent's image cannot be pulled, {where}{more}: {detail}. Fix: run the "
            "controller with an --agent-image the nodes can pull (`make run AGENT_IMAGE=...`, "
            "or the chart's and manifests' agent image), with pull access from these nodes.",
        )
    return (
        REASON_IMAGE_PULL,
        f"An image cannot be pulled, {where}{more}: {detail}. Fix: the image in the "
        "template, or its imagePullSecrets.",
    )


def agent_crashing(p: Pass) -> Cause | None:
    """The agent's sidecar keeps exiting and the kubelet backs off restarting it. Between two
    back-offs it runs for a moment: while the gang is said to be stuck on it, an agent that
    runs again after a crash, not yet through its barrier probe, still counts (the condition
    would flap, an Event each time, otherwise)."""
    said = is_true(p.status.conditions, ConditionType.STUCK) and _reason(p) == REASON_AGENT_CRASHING
    hits = _containers(p, lambda c: _crash_looping(c) or (said and _between_back_offs(c)))
    if not hits:
        return None
    worker, pod, container = hits[0]
    count = len({w for w, _, _ in hits})
    more = f" (and {count - 1} more worker(s))" if count > 1 else ""
    code = (
        "" if container.last_exit_code is None else f", last exit code {container.last_exit_code}"
    )
    return (
        REASON_AGENT_CRASHING,
        f"The agent keeps crashing: container {AGENT_CONTAINER} of {worker_text(p, worker)}"
        f"{more} is in {CRASH_LOOP}{code}. Its log says why: "
        f"`kubectl logs {pod.name} -c {AGENT_CONTAINER} --previous`. Fix: an agent image of "
        "this controller's version (--agent-image), and the pod's access to the apiserver.",
    )


def _crash_looping(c: ContainerView) -> bool:
    return c.name == AGENT_CONTAINER and c.state == "waiting" and c.reason == CRASH_LOOP


def _between_back_offs(c: ContainerView) -> bool:
    """Running again after an exit of its own (not the protocol's 86, not the kubelet's
    restart of the whole pod), and not through its startup probe yet."""
    return (
        c.name == AGENT_CONTAINER
        and c.state == "running"
        and c.started is not True
        and c.last_exit_code not in (None, 0, RESTART_EXIT_CODE)
        and c.last_reason != RESTARTING_ALL_CONTAINERS
    )


def _reason(p: Pass) -> str | None:
    condition = get_condition(p.status.conditions, ConditionType.STUCK)
    return None if condition is None else condition.reason


def elastic_at_minimum(p: Pass) -> Cause | None:
    """An elastic gang at a shut barrier waits for workers whose pods no node has taken for
    `elastic.waitSeconds`, and cannot go on without them: it is at `minReplicas`, or one is
    the coordinator, `MASTER_ADDR` (docs/design.md section 3.12)."""
    elastic = p.job.spec.elasticity
    if elastic is None or p.status.barrier_epoch == p.status.epoch or p.is_finished():
        return None
    wait = timedelta(seconds=elastic.bounds.wait_seconds)
    # Not a pod this pass deletes (a laggard recreated): the next pass, which sees it
    # terminating, must say the same.
    staying = p.staying()
    waiting = [
        w
        for w in p.active()
        if (pod := staying.get(w)) is not None
        and (since := unschedulable_since(pod)) is not None
        and p.now - since >= wait
    ]
    if not waiting:
        return None
    named = "; ".join(_laggard(p, w, staying.get(w)) for w in waiting[:SHOWN])
    more = f"; and {len(waiting) - SHOWN} more" if len(waiting) > SHOWN else ""
    coordinator = p.job.spec.coordinator_worker.worker
    minimum = f"{elastic.field}.minReplicas"
    if coordinator in waiting:
        why = f"worker {coordinator} holds MASTER_ADDR"
    elif waiting[0] < elastic.first:
        why = f"worker {waiting[0]} is of a role that is not elastic"
    else:
        why = f"the gang is at {minimum} ({elastic.bounds.min_replicas})"
    return (
        REASON_ELASTIC_AT_MINIMUM,
        f"{len(waiting)} workers cannot be placed and the gang cannot go on without them: "
        f"{why}: {named}{more}. Fix: make room for them (nodes, quota), or lower "
        f"{minimum}.",
    )


def barrier_stalled(p: Pass) -> Cause | None:
    """The barrier of the epoch is still shut, and some worker has not arrived for longer than
    the bound since the restart began (or the gang started, or its pod was created)."""
    if p.status.barrier_epoch == p.status.epoch or p.is_finished():
        return None
    last = (
        p.status.last_restart
        if p.status.last_restart and p.status.last_restart.epoch == p.status.epoch
        else None
    )
    began = last.detected_at if last is not None else p.status.start_time
    if began is None:
        return None
    bound = min(p.config.barrier_stall_seconds, p.job.spec.restart.barrier_timeout_seconds)
    staying = p.staying()
    active = p.active()
    missing: list[int] = []
    for worker in active:
        pod = staying.get(worker)
        if (pod is not None and pod.arrived_epoch == p.status.epoch) or worker in p.create_pods:
            continue  # arrived, or its pod is created now: it has all its time ahead
        since = began
        if pod is not None and pod.creation_timestamp is not None:
            since = max(since, pod.creation_timestamp)
        due = since + timedelta(seconds=bound)
        if p.now >= due:
            missing.append(worker)
        else:
            p.requeue((due - p.now).total_seconds())
    if not missing:
        return None
    named = "; ".join(_laggard(p, w, staying.get(w)) for w in missing[:SHOWN])
    more = f"; and {len(missing) - SHOWN} more" if len(missing) > SHOWN else ""
    return (
        REASON_BARRIER_STALLED,
        f"{len(missing)} of {len(active)} workers have not arrived at epoch {p.status.epoch} for "
        f"more than {bound:g}s: {named}{more}. Fix: see why in `kubectl describe pod` and the "
        f"agent's log (`kubectl logs <pod> -c {AGENT_CONTAINER}`); a worker of a restart "
        "still missing after spec.restart.barrierTimeoutSeconds is recreated.",
    )


def _laggard(p: Pass, worker: int, pod: PodView | None) -> str:
    text = worker_text(p, worker)
    if pod is None:
        return f"{text}: no pod"
    state = pod.phase or "no phase"
    scheduled = pod.conditions.get("PodScheduled")
    if scheduled is not None and scheduled[0] == "False" and scheduled[1]:
        state += f", {scheduled[1]}"
    waiting = [
        f"{c.name} {c.reason}" for c in pod.all_containers if c.state == "waiting" and c.reason
    ]
    if waiting:
        state += f", waiting: {', '.join(waiting[:2])}"
    return f"{text}: {state}"


def _containers(
    p: Pass, match: Callable[[ContainerView], bool]
) -> list[tuple[int, PodView, ContainerView]]:
    """(worker, pod, container) of the live running-role workers' containers that match, in
    worker order. `match` sees only the containers waiting or starting
    (`PodView.unsettled_containers`): what these checks look for is never running past its
    startup probe, nor terminated."""
    staying = p.staying()
    hits: list[tuple[int, PodView, ContainerView]] = []
    for worker in p.active():
        pod = staying.get(worker)
        if pod is None or not pod.unsettled_containers or pod.phase in POD_TERMINAL:
            continue
        hits.extend((worker, pod, c) for c in pod.unsettled_containers if match(c))
    return hits


def _arrival_channel(p: Pass) -> None:
    """With the endpoint served, an arrival at the epoch by annotation means that the agent
    could not reach it (it falls back after 5 s out of reach, or when refused)."""
    url = p.config.arrival_url
    if url is None:
        return
    staying = p.staying()
    active = p.active()
    by_annotation = [
        w
        for w in active
        if w in staying
        and parse_decimal_int(staying[w].annotations.get(ANNOTATION_EPOCH)) == p.status.epoch
    ]
    degraded = get_condition(p.status.conditions, ConditionType.ARRIVAL_DEGRADED)
    if by_annotation:
        shown = _workers_text(p, by_annotation)
        message = (
            f"{len(by_annotation)} of {len(active)} workers arrived at epoch {p.status.epoch} by "
            f"pod annotation, not at the controller's arrival endpoint {url}: {shown}. They cannot "
            "reach it (a network policy, the Service gangjob-arrivals, or --arrival-url) or it "
            "refused them; restarts still work, at one pod write per worker"
            + (
                ", but their progress does not reach the controller: their hangs go unseen"
                if p.job.spec.progress.hang_seconds is not None
                else ""
            )
            + ". Fix: let the workers reach that URL."
        )
        if degraded is None or degraded.status != ConditionStatus.TRUE:
            p.events.append(EventSpec("Warning", REASON_ARRIVAL_UNREACHABLE, message))
        p.set_condition(
            ConditionType.ARRIVAL_DEGRADED,
            ConditionStatus.TRUE,
            REASON_ARRIVAL_UNREACHABLE,
            message,
        )
    elif degraded is not None and degraded.status == ConditionStatus.TRUE:
        arrived = all(w in staying and staying[w].arrived_epoch == p.status.epoch for w in active)
        if arrived:
            p.set_condition(
                ConditionType.ARRIVAL_DEGRADED,
                ConditionStatus.FALSE,
                REASON_ARRIVALS_DIRECT,
                f"Every worker arrived at epoch {p.status.epoch} through the arrival endpoint",
            )


def _workers_text(p: Pass, workers: Sequence[int]) -> str:
    shown = ", ".join(worker_text(p, w) for w in workers[:SHOWN])
    return shown + (f" and {len(workers) - SHOWN} more" if len(workers) > SHOWN else "")


def _cut(text: str | None) -> str:
    text = (text or "").strip()
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 3] + "..."
