"""The manifests the controller creates for a GangJob: its headless Service and its worker pods
(`<job>-<role>-<index>`, or `<job>-<index>` for a job written with `replicas` + `template`, built
from the role's template), the workers' environment, and the seam where the restart mode shapes
a worker pod. Pure: returns dicts, talks to nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from api.constants import (
    AGENT_CONTAINER,
    AGENT_IMAGE_ZIPAPP,
    AGENT_INSTALL_CONTAINER,
    AGENT_PORT_NAME,
    AGENT_RESOURCES,
    AGENT_TOKEN_VOLUME,
    AGENT_VOLUME,
    ANNOTATION_CREATED_EPOCH,
    ANNOTATION_EPOCH,
    ANNOTATION_EXIT,
    API_VERSION,
    ARRIVAL_AUDIENCE,
    ARRIVAL_TOKEN_SECONDS,
    ARRIVAL_TOKEN_VOLUME,
    BARRIER_PATH,
    BARRIER_PROBE_SLACK_SECONDS,
    DEFAULT_AGENT_PORT,
    DEFAULT_ARRIVAL_TOKEN,
    DEFAULT_DIR,
    DEFAULT_PROGRESS_SUMMARY_SECONDS,
    ENV_AGENT_PORT,
    ENV_AGENT_RANK,
    ENV_ARRIVAL_CA_PEM,
    ENV_ARRIVAL_TOKEN,
    ENV_ARRIVAL_URL,
    ENV_DIR,
    ENV_GANGJOB_NAME,
    ENV_HANG_SECONDS,
    ENV_LAUNCHED,
    ENV_MASTER_ADDR,
    ENV_MASTER_PORT,
    ENV_POD_NAME,
    ENV_POD_NAMESPACE,
    ENV_POD_UID,
    ENV_PROGRESS,
    ENV_PROGRESS_SUMMARY_SECONDS,
    ENV_RANK,
    ENV_ROLE,
    ENV_ROLE_INDEX,
    ENV_ROLE_REPLICAS,
    ENV_WORLD_SIZE,
    KIND,
    LABEL_NAME,
    LABEL_RANK,
    LABEL_ROLE,
    LABEL_ROLE_INDEX,
    PROGRESS_DIR,
    PROGRESS_FILE,
    RESTART_EXIT_CODE,
    RESTART_MODES,
    SERVICE_ACCOUNT_DIR,
    WORKER_SERVICE_ACCOUNT,
    WRAPPED_ZIPAPP,
    AgentPlacement,
)
from api.naming import coordinator_pod_name, master_addr, service_name, worker_pod_name
from api.v1alpha1 import GangJob, RestartMode, Role, WorkerSlot
from controller.policy import kueue
from controller.policy.classify import retriable_exit_codes
from controller.policy.torchrun import nproc_per_node, torchrun_env
from controller.policy.views import parse_quantity

RENDEZVOUS_PORT_NAME: Final = "rendezvous"

# Annotations only the agent (or the controller at creation) may write: copied from a template
# they would make a fresh worker look arrived, or report an exit that never happened.
_PROTOCOL_ANNOTATIONS: Final = frozenset(
    {ANNOTATION_EPOCH, ANNOTATION_EXIT, ANNOTATION_CREATED_EPOCH}
)


def owner_reference(job: GangJob) -> dict[str, Any]:
    """The controller ownerReference to the GangJob, so garbage collection deletes what it owns
    and `blockOwnerDeletion` keeps a foreground deletion of the job waiting for its pods."""
    if not job.metadata.uid:
        raise ValueError(f"GangJob {job.metadata.name} has no metadata.uid to own pods with")
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": job.metadata.name,
        "uid": job.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def build_service(job: GangJob) -> dict[str, Any]:
    """The headless Service `<job>` that gives every worker the DNS name `<job>-<rank>.<job>`.

    `publishNotReadyAddresses`: workers must resolve rank 0 before any of them is Ready, since
    rendezvous is what makes them ready.
    """
    name = job.metadata.name
    port = job.spec.master_port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service_name(name),
            "namespace": job.metadata.namespace,
            "labels": {LABEL_NAME: name},
            "ownerReferences": [owner_reference(job)],
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {LABEL_NAME: name},
            "ports": [
                {
                    "name": RENDEZVOUS_PORT_NAME,
                    "port": port,
                    "targetPort": port,
                    "protocol": "TCP",
                }
            ],
        },
    }


def worker_env(job: GangJob, worker: int) -> list[dict[str, Any]]:
    """The environment every trainer gets (docs/design.md section 3b, docs/api.md): the
    process group's (`rank_env`), then the role's (`role_env`).

    The epoch is not in it: the epoch changes without the pod being recreated, so the agent
    hands it to the training process instead.
    """
    slot = job.spec.workers[worker]
    return [*rank_env(job, slot), *role_env(slot), *torchrun_worker_env(job, slot)]


def rank_env(job: GangJob, slot: WorkerSlot) -> list[dict[str, Any]]:
    """The training process group: `MASTER_ADDR` (the coordinator, by default rank 0),
    `MASTER_PORT`, `WORLD_SIZE` (the workers of the ranked roles) and, in a ranked role, the
    worker's global `RANK`; then `GANGJOB_NAME`."""
    name = job.metadata.name
    env = [
        {"name": ENV_MASTER_ADDR, "value": master_addr(name, coordinator_pod_name(job))},
        {"name": ENV_MASTER_PORT, "value": str(job.spec.master_port)},
        {"name": ENV_WORLD_SIZE, "value": str(job.spec.world_size)},
    ]
    if slot.rank is not None:
        env.append({"name": ENV_RANK, "value": str(slot.rank)})
    env.append({"name": ENV_GANGJOB_NAME, "value": name})
    return env


def torchrun_worker_env(job: GangJob, slot: WorkerSlot) -> list[dict[str, Any]]:
    """What torchrun reads (`PET_*`), for a worker of a ranked role: one pod is one torchrun
    node, its node rank the worker's `RANK`, the nodes `WORLD_SIZE`, and the processes per node
    `spec.nprocPerNode` (`auto`: the GPU limit of the role's trainer)."""
    if slot.rank is None:
        return []
    _, trainer = _trainer(slot.role.template["spec"], slot.role.trainer_container_name)
    nproc = nproc_per_node(job.spec.nproc_per_node, trainer)
    addr = master_addr(job.metadata.name, coordinator_pod_name(job))
    return torchrun_env(slot.rank, job.spec.world_size, nproc, addr, job.spec.master_port)


def role_env(slot: WorkerSlot) -> list[dict[str, Any]]:
    """The worker's role: its name, its index in the role, the role's size."""
    return [
        {"name": ENV_ROLE, "value": slot.role.name},
        {"name": ENV_ROLE_INDEX, "value": str(slot.index)},
        {"name": ENV_ROLE_REPLICAS, "value": str(slot.role.replicas)},
    ]


def _merge_env(user_env: Iterable[Any], ours: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # Ours replace the user's namesakes, and come first: Kubernetes expands `$(VAR)` only from
    # variables defined earlier in the list, so the user's own may then refer to `$(RANK)`.
    names = {entry["name"] for entry in ours}
    kept = [e for e in user_env if not (isinstance(e, Mapping) and e.get("name") in names)]
    return [*ours, *kept]


def build_pod(
    job: GangJob,
    worker: int,
    agent_image: str,
    arrival_url: str | None = None,
    arrival_ca: str | None = None,
) -> dict[str, Any]:
    """The pod of worker number `worker` (`worker_pod_name`), built from its role's template.

    The template's labels and annotations are kept; the controller's labels (job, worker
    number, role, index in the role) win over same-named ones. The pod records the
    `status.epoch` it is created at (`gangjob.io/created-epoch`); `gangjob.io/epoch` is left to
    the agent, which writes it when the worker arrives. A GangJob labelled with a Kueue queue
    makes its workers one Kueue pod group (controller/policy/kueue.py). `restartPolicy` is
    `Never` whatever the template says: restarts are the gang's business (the CRD documents
    that the controller sets it). Raises `PodSpecError` when the template cannot be shaped for
    the restart mode in effect.
    """
    name = job.metadata.name
    slot = job.spec.workers[worker]
    role = slot.role
    template = role.template
    template_meta: Mapping[str, Any] = template.get("metadata") or {}
    # A deep copy: the template belongs to the GangJob object, and pods must not share dicts.
    spec: dict[str, Any] = copy.deepcopy(template["spec"])

    labels = {
        **(template_meta.get("labels") or {}),
        LABEL_NAME: name,
        LABEL_RANK: str(worker),
        LABEL_ROLE: role.name,
        LABEL_ROLE_INDEX: str(slot.index),
    }
    annotations = {
        key: value
        for key, value in (template_meta.get("annotations") or {}).items()
        if key not in _PROTOCOL_ANNOTATIONS
    }
    annotations[ANNOTATION_CREATED_EPOCH] = str(job.status.epoch)
    kueue_labels, kueue_annotations = kueue.pod_group_metadata(job)
    labels.update(kueue_labels)
    annotations.update(kueue_annotations)

    pod_name_ = worker_pod_name(job, worker)
    spec["hostname"] = pod_name_
    spec["subdomain"] = service_name(name)
    # A kubelet restart of a worker outside the protocol would rejoin a gang that moved on; and
    # on a cluster that drops container-level restart policies (gate off), the pod's is all
    # that keeps the trainer from restarting on its own.
    spec["restartPolicy"] = "Never"
    trainer = role.trainer_container_name
    for container in spec["containers"]:
        if container.get("name") == trainer:
            container["env"] = _merge_env(container.get("env") or [], worker_env(job, worker))

    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name_,
            "namespace": job.metadata.namespace,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [owner_reference(job)],
        },
        "spec": spec,
    }
    mode = job.status.mode or job.spec.restart.mode
    return apply_restart_mode(pod, job, mode, agent_image, arrival_url, role, arrival_ca)


_RESTART_ALL_CONTAINERS: Final = "RestartAllContainers"


# --- errors -------------------------------------------------------------------------------------


class PodSpecError(ValueError):
    """The template cannot be made into a worker pod for the restart mode in effect.

    Not transient: the job's spec must change. `reason` (CamelCase) and the message, which names
    the field, are meant for a status condition and an Event.
    """

    reason: ClassVar[str] = "InvalidPodTemplate"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class TrainerCommandRequired(PodSpecError):
    """`Process` mode wraps the trainer's command with the agent, and the image's ENTRYPOINT is
    unknown to the controller: the template must spell out the trainer's `command`."""

    reason = "TrainerCommandRequired"


class TemplateConflict(PodSpecError):
    """The template uses a name or path the controller injects, or sets the trainer's restart
    policy, which the controller owns (it follows `spec.failurePolicy`)."""

    reason = "TemplateConflict"


# --- the failure policy, as the kubelet applies it -------------------------------------------


def trainer_restart_rule(job: GangJob, role: Role | None = None) -> dict[str, Any] | None:
    """The trainer's `RestartAllContainers` rule (KEP-5532) for `Pod` mode: it matches exactly
    the exit codes the failure policy sends to `RestartGang` for a worker of `role` (by default
    the first) (`classify.retriable_exit_codes`, the controller's own classification); None if
    it sends none there.

    Every other code (FailJob, RecreateWorker, Ignore) must stay out: after a whole-pod restart
    the kubelet keeps no real exit code, so a trainer that exits with one of them has to stay
    terminated for the controller to read and classify its code.
    """
    codes = retriable_exit_codes(job, role)
    if codes is None:
        return None
    operator, values = codes
    return {
        "action": _RESTART_ALL_CONTAINERS,
        "exitCodes": {"operator": operator.value, "values": values},
    }


# --- the restart modes ---------------------------------------------------------------------------


def apply_restart_mode(
    pod: dict[str, Any],
    job: GangJob,
    mode: RestartMode,
    agent_image: str,
    arrival_url: str | None = None,
    role: Role | None = None,
    arrival_ca: str | None = None,
) -> dict[str, Any]:
    """Shape the worker pod `build_pod` made of `role` (by default the first) for the restart
    mode in effect; returns `pod`, changed in place. The template's own volumes, containers and
    init containers are kept; ours are added after them. Where the mode puts the agent
    (`RESTART_MODES`) picks the shaping function: `_add_sidecar` or `_wrap_trainer`.

    Every mode: the trainer gets `restartPolicy: Never` (container level, which overrides the
    pod's) and `GANGJOB_DIR`; the pod runs as `WORKER_SERVICE_ACCOUNT` unless the template names
    a ServiceAccount. With `arrival_url` (the controller's arrival endpoint) the agent gets it,
    and a token for it; with `arrival_ca` (PEM, for an `https://` endpoint) the CA to verify it
    with, in its environment: the pod carries it from its creation, as it does the URL.
    Raises `PodSpecError` when the template cannot be shaped so.
    """
    spec: dict[str, Any] = pod["spec"]
    role = role or job.spec.effective_roles[0]
    index, trainer = _trainer(spec, role.trainer_container_name)
    template_field = _template_field(job, role)
    field = f"{template_field}.spec.containers[{index}]"
    _check_reserved(spec, trainer, template_field, field)
    qos_guaranteed = _guaranteed(spec)
    spec["volumes"] = [*(spec.get("volumes") or []), {"name": AGENT_VOLUME, "emptyDir": {}}]
    if not (spec.get("serviceAccountName") or spec.get("serviceAccount")):
        spec["serviceAccountName"] = WORKER_SERVICE_ACCOUNT
    # The agent authenticates with the pod's token; a template that turned the automatic mount
    # off gets it in the agent's container only, as kubelet would mount it.
    token_mounts: list[dict[str, Any]] = []
    if spec.get("automountServiceAccountToken") is False:
        spec["volumes"].append(_token_volume())
        token_mounts = [
            {"name": AGENT_TOKEN_VOLUME, "mountPath": SERVICE_ACCOUNT_DIR, "readOnly": True}
        ]
    agent_env = _agent_env(job)
    if arrival_url:
        spec["volumes"].append(_arrival_token_volume())
        token_mounts.append(
            {
                "name": ARRIVAL_TOKEN_VOLUME,
                "mountPath": DEFAULT_ARRIVAL_TOKEN.rsplit("/", 1)[0],
                "readOnly": True,
            }
        )
        agent_env += [
            {"name": ENV_ARRIVAL_URL, "value": arrival_url},
            {"name": ENV_ARRIVAL_TOKEN, "value": DEFAULT_ARRIVAL_TOKEN},
        ]
        if arrival_ca and arrival_url.startswith("https://"):
            agent_env.append({"name": ENV_ARRIVAL_CA_PEM, "value": arrival_ca})

    trainer["restartPolicy"] = "Never"
    shape = _SHAPERS[RESTART_MODES[mode].agent]
    shape(
        _Shaping(
            spec=spec,
            job=job,
            mode=mode,
            trainer=trainer,
            field=field,
            agent_image=agent_image,
            agent_env=agent_env,
            token_mounts=token_mounts,
            qos_guaranteed=qos_guaranteed,
            role=role,
        )
    )
    return pod


@dataclass(frozen=True)
class _Shaping:
    """What a mode's shaping function works on: the pod's spec (changed in place), its trainer
    container (`field` names it in errors), and what the agent's containers get."""

    spec: dict[str, Any]
    job: GangJob
    mode: RestartMode
    trainer: dict[str, Any]
    field: str
    agent_image: str
    agent_env: list[dict[str, Any]]
    token_mounts: list[dict[str, Any]]
    qos_guaranteed: bool
    role: Role

    def add_install(self) -> None:
        """The init container that copies the agent's zipapp into the shared volume."""
        install = _agent_container(
            AGENT_INSTALL_CONTAINER, self.agent_image, self.spec, self.qos_guaranteed
        )
        install["command"] = ["cp", AGENT_IMAGE_ZIPAPP, WRAPPED_ZIPAPP]
        self.spec["initContainers"] = [*(self.spec.get("initContainers") or []), install]


def _wrap_trainer(w: _Shaping) -> None:
    """The agent wraps the trainer (`Process` mode): an init container copies the agent's
    zipapp into the shared volume, and the trainer's command runs under `agent.pyz wrap --`,
    which restarts it inside the container."""
    command = w.trainer.get("command")
    if not command:
        raise TrainerCommandRequired(
            f"{w.field}.command",
            f"restart mode {w.mode} runs the trainer's command under the agent, and the "
            "image's ENTRYPOINT is unknown to the controller: set `command` (and `args`)",
        )
    w.trainer["command"] = [
        "python3",
        WRAPPED_ZIPAPP,
        AgentPlacement.WRAPPER.value,
        "--",
        *command,
        *(w.trainer.pop("args", None) or []),
    ]
    # The agent runs in the trainer's container here: it needs all of its environment,
    # and writes the `epoch` file itself.
    w.trainer["env"] = _merge_env(w.trainer.get("env") or [], w.agent_env)
    _add_mounts(w.trainer, [_dir_mount(read_only=False), *w.token_mounts])
    w.add_install()


def _add_sidecar(w: _Shaping) -> None:
    """The agent is a native sidecar (`Pod`, `Recreate` modes), last of the init containers (so
    the user's init work is done before the worker arrives), whose startup probe on `/barrier`
    is the barrier: it holds the regular containers back until the gang's barrier is open.
    Where the mode has restart rules (`Pod`), its `RestartAllContainers` rule on
    `RESTART_EXIT_CODE` restarts the whole pod in place and the trainer's rule
    (`trainer_restart_rule`) does the same for its retriable exit codes; without them a failed
    worker stays terminated and the controller recreates it."""
    trainer, spec = w.trainer, w.spec
    # An elastic gang's trainer learns its epoch's RANK and WORLD_SIZE from the launcher.
    launched = w.job.spec.nproc_per_node is not None or w.job.spec.elasticity is not None
    trainer["env"] = _merge_env(trainer.get("env") or [], _progress_env())
    if launched:
        # The launcher writes its trainer's success there (`TRAINER_EXIT_FILE`).
        _add_mounts(trainer, [_dir_mount(read_only=False)])
        _launch_through_agent(trainer, w.field, w.mode)
        w.add_install()
    else:
        # The agent's directory is read-only to the trainer, but for the one it reports its
        # progress in.
        progress_mount = {
            "name": AGENT_VOLUME,
            "mountPath": f"{DEFAULT_DIR}/{PROGRESS_DIR}",
            "subPath": PROGRESS_DIR,
        }
        _add_mounts(trainer, [_dir_mount(read_only=True), progress_mount])
    agent = _agent_container(AGENT_CONTAINER, w.agent_image, spec, w.qos_guaranteed)
    agent["args"] = [AgentPlacement.SIDECAR.value]
    agent["restartPolicy"] = "Always"
    # The launcher's sidecar ends a held worker once its role is Complete: it reads the role.
    launched_env = [{"name": ENV_LAUNCHED, "value": "1"}, {"name": ENV_ROLE, "value": w.role.name}]
    agent["env"] = [*w.agent_env, *launched_env] if launched else w.agent_env
    agent["ports"] = [{"name": AGENT_PORT_NAME, "containerPort": DEFAULT_AGENT_PORT}]
    agent["startupProbe"] = {
        "httpGet": {"path": BARRIER_PATH, "port": DEFAULT_AGENT_PORT},
        "periodSeconds": 1,
        "timeoutSeconds": 1,
        "failureThreshold": w.job.spec.restart.barrier_timeout_seconds
        + BARRIER_PROBE_SLACK_SECONDS,
    }
    _add_mounts(agent, w.token_mounts)
    if RESTART_MODES[w.mode].restart_rules:
        agent["restartPolicyRules"] = [
            {
                "action": _RESTART_ALL_CONTAINERS,
                "exitCodes": {"operator": "In", "values": [RESTART_EXIT_CODE]},
            }
        ]
        rule = trainer_restart_rule(w.job, w.role)
        if rule is not None:
            trainer["restartPolicyRules"] = [rule]
    spec["initContainers"] = [*(spec.get("initContainers") or []), agent]


_SHAPERS: Final[Mapping[AgentPlacement, Callable[[_Shaping], None]]] = {
    AgentPlacement.WRAPPER: _wrap_trainer,
    AgentPlacement.SIDECAR: _add_sidecar,
}
"""How the pod is shaped for where the mode puts the agent (`RESTART_MODES`)."""


def _launch_through_agent(trainer: dict[str, Any], field: str, mode: RestartMode) -> None:
    """`spec.nprocPerNode` or `spec.elastic` set, in `Pod` and `Recreate` modes: the trainer's
    command runs as `agent.pyz launch -- <command> <args>`, which execs it with the epoch's
    rendezvous id, and an elastic gang's `RANK` and `WORLD_SIZE` of the epoch (an in-place
    restart keeps the pod's environment, so only the agent can give them)."""
    command = trainer.get("command")
    if not command:
        raise TrainerCommandRequired(
            f"{field}.command",
            f"spec.nprocPerNode or spec.elastic runs the trainer's command through the agent "
            f"(restart mode "
            f"{mode}), and the image's ENTRYPOINT is unknown to the controller: set `command`",
        )
    trainer["command"] = [
        "python3",
        WRAPPED_ZIPAPP,
        "launch",
        "--",
        *command,
        *(trainer.pop("args", None) or []),
    ]


def _template_field(job: GangJob, role: Role) -> str:
    """Where the role's template is in the spec, for errors that name the field."""
    if job.spec.shorthand:
        return "spec.template"
    return f"spec.roles[{job.spec.effective_roles.index(role)}].template"


def _trainer(spec: Mapping[str, Any], name: str) -> tuple[int, dict[str, Any]]:
    for index, container in enumerate(spec["containers"]):
        if container.get("name") == name:
            return index, container
    # GangJobSpec validates that the trainer exists; this is a programming error.
    raise AssertionError(f"no trainer container {name!r} in the pod")


def _check_reserved(
    spec: Mapping[str, Any], trainer: Mapping[str, Any], template_field: str, field: str
) -> None:
    for key in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(key) or []):
            if container.get("name") in (AGENT_CONTAINER, AGENT_INSTALL_CONTAINER):
                raise TemplateConflict(
                    f"{template_field}.spec.{key}[{index}].name",
                    f"{container.get('name')!r} is the name of the container the controller "
                    "injects",
                )
    for index, volume in enumerate(spec.get("volumes") or []):
        if volume.get("name") in (AGENT_VOLUME, AGENT_TOKEN_VOLUME, ARRIVAL_TOKEN_VOLUME):
            raise TemplateConflict(
                f"{template_field}.spec.volumes[{index}].name",
                f"{volume.get('name')!r} is the name of a volume the controller injects",
            )
    for index, mount in enumerate(trainer.get("volumeMounts") or []):
        if mount.get("mountPath", "").rstrip("/") == DEFAULT_DIR:
            raise TemplateConflict(
                f"{field}.volumeMounts[{index}].mountPath",
                f"{DEFAULT_DIR} is where the controller mounts the agent's directory",
            )
    if trainer.get("restartPolicyRules") or trainer.get("restartPolicy") not in (None, "Never"):
        raise TemplateConflict(
            f"{field}.restartPolicy",
            "the controller sets the trainer's restart policy and rules from "
            "spec.failurePolicy and spec.restart.mode: express restarts there",
        )


def _guaranteed(spec: Mapping[str, Any]) -> bool:
    """Whether the template's pod is in the Guaranteed QoS class by its containers' resources:
    the agent must not turn it Burstable (exclusive CPUs and NUMA alignment depend on it)."""
    containers = [*(spec.get("initContainers") or []), *spec["containers"]]
    for container in containers:
        resources = container.get("resources") or {}
        limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
        for resource in ("cpu", "memory"):
            limit = limits.get(resource)
            if limit is None:
                return False
            request = requests.get(resource, limit)
            if parse_quantity(str(request)) != parse_quantity(str(limit)):
                return False
    return True


def _agent_rank_env() -> dict[str, Any]:
    """The agent's worker number (sidecar or wrapper), which an elastic gang's agent gives its
    trainer as the epoch's `RANK` (docs/design.md section 3.12). Only an elastic gang's: the
    agent of another keeps the pod's environment as it is."""
    return {
        "name": ENV_AGENT_RANK,
        "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{LABEL_RANK}']"}},
    }


def _agent_container(
    name: str, agent_image: str, spec: Mapping[str, Any], qos_guaranteed: bool
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": name,
        "image": agent_image,
        "volumeMounts": [_dir_mount(read_only=False)],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
        },
    }
    # With pod-level resources (KEP-2837) the containers share the pod's budget, and requests
    # of ours could overflow it: the agent takes its share unannounced.
    if not spec.get("resources"):
        resources: dict[str, Any] = {"requests": dict(AGENT_RESOURCES)}
        if qos_guaranteed:
            resources["limits"] = dict(AGENT_RESOURCES)
        container["resources"] = resources
    return container


def _progress_env() -> list[dict[str, Any]]:
    """A trainer the kubelet starts: where the agent's directory is and where it writes its
    progress. Not `PYTHONPATH`: the pod's would replace the image's own (the trainer image's
    site-packages are often there), which the controller cannot see; such a trainer imports the
    helper from `$GANGJOB_DIR/python` (docs/api.md "Progress")."""
    return [
        {"name": ENV_DIR, "value": DEFAULT_DIR},
        {"name": ENV_PROGRESS, "value": f"{DEFAULT_DIR}/{PROGRESS_FILE}"},
    ]


SUMMARIES_PER_SECOND: Final = 50
"""The most progress summaries a second one gang's agents send the controller: each costs it
0.2-0.5 ms of CPU (its HTTP handling; docs/progress.md), so at most 1-2.5% of a core, whatever
the gang's size."""


def summary_seconds(workers: int) -> float:
    """How often each agent of a gang of `workers` may send its progress summary: every 30 s,
    and for gangs of more than 1500 every N/`SUMMARIES_PER_SECOND` s (100 s at N=5000). A
    stall, a new checkpoint and a shift of the compute go at once whatever the period; the
    periodic summary only refreshes the step rate the controller extrapolates."""
    return max(DEFAULT_PROGRESS_SUMMARY_SECONDS, workers / SUMMARIES_PER_SECOND)


def _agent_env(job: GangJob) -> list[dict[str, Any]]:
    """What the agent reads from its environment."""
    progress: list[dict[str, Any]] = []
    if job.spec.progress.hang_seconds is not None:
        progress.append({"name": ENV_HANG_SECONDS, "value": str(job.spec.progress.hang_seconds)})
    period = summary_seconds(len(job.spec.workers))
    if period != DEFAULT_PROGRESS_SUMMARY_SECONDS:
        progress.append({"name": ENV_PROGRESS_SUMMARY_SECONDS, "value": f"{period:g}"})
    return [
        {"name": ENV_GANGJOB_NAME, "value": job.metadata.name},
        {"name": ENV_POD_NAME, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {
            "name": ENV_POD_NAMESPACE,
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
        },
        {"name": ENV_POD_UID, "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        {"name": ENV_AGENT_PORT, "value": str(DEFAULT_AGENT_PORT)},
        {"name": ENV_DIR, "value": DEFAULT_DIR},
        *progress,
        *([_agent_rank_env()] if job.spec.elasticity is not None else []),
    ]


def _arrival_token_volume() -> dict[str, Any]:
    return {
        "name": ARRIVAL_TOKEN_VOLUME,
        "projected": {
            "sources": [
                {
                    "serviceAccountToken": {
                        "path": "token",
                        "audience": ARRIVAL_AUDIENCE,
                        "expirationSeconds": ARRIVAL_TOKEN_SECONDS,
                    }
                }
            ]
        },
    }


def _dir_mount(*, read_only: bool) -> dict[str, Any]:
    mount: dict[str, Any] = {"name": AGENT_VOLUME, "mountPath": DEFAULT_DIR}
    if read_only:
        mount["readOnly"] = True
    return mount


def _add_mounts(container: dict[str, Any], mounts: list[dict[str, Any]]) -> None:
    if mounts:
        container["volumeMounts"] = [*(container.get("volumeMounts") or []), *mounts]


def _token_volume() -> dict[str, Any]:
    """The projected volume the kubelet mounts as `kube-api-access-*`: a token bound to the pod
    (so it carries the pod's name, which the worker policy checks), the cluster CA, the
    namespace."""
    return {
        "name": AGENT_TOKEN_VOLUME,
        "projected": {
            "sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                {
                    "configMap": {
                        "name": "kube-root-ca.crt",
                        "items": [{"key": "ca.crt", "path": "ca.crt"}],
                    }
                },
                {
                    "downwardAPI": {
                        "items": [
                            {
                                "path": "namespace",
                                "fieldRef": {"fieldPath": "metadata.namespace"},
                            }
                        ]
                    }
                },
            ]
        },
    }
