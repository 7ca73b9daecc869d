"""Every protocol name of GangJob, in one place (docs/design.md sections 3 and 3b): API group and
resource names, the labels and annotations on worker pods, condition types and reasons, worker
environment variables, and the agent's contract with the pod builder (exit code, ports, paths).

Standard library only: the controller, the API models and the agent all import it, and the
agent's zipapp (agent/build.py) bundles it, so no name is spelled twice.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

GROUP: Final = "gangjob.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "GangJob"
LIST_KIND: Final = "GangJobList"
PLURAL: Final = "gangjobs"
SINGULAR: Final = "gangjob"
SHORT_NAME: Final = "gj"
CATEGORY: Final = "gangjob"
CRD_NAME: Final = f"{PLURAL}.{GROUP}"

# Labels on every worker pod (and the selector of the headless Service).
LABEL_NAME: Final = "gangjob.io/name"
LABEL_RANK: Final = "gangjob.io/rank"
LABEL_ROLE: Final = "gangjob.io/role"
LABEL_ROLE_INDEX: Final = "gangjob.io/role-index"

# Annotations on a worker pod, written by the agent on its own pod only.
ANNOTATION_EPOCH: Final = "gangjob.io/epoch"
"""The epoch this worker has arrived at (decimal integer)."""
ANNOTATION_EXIT: Final = "gangjob.io/exit"
"""`Process` mode: the trainer's last exit, as `<epoch>:<code>`."""

# Annotations the controller writes on a worker pod when it creates it.
ANNOTATION_CREATED_EPOCH: Final = "gangjob.io/created-epoch"
"""The `status.epoch` at which the controller created the pod (written by the controller, at
creation only)."""
ANNOTATION_RESTART_MODE: Final = "gangjob.io/restart-mode"
"""The restart mode the controller built the pod for (written at creation only): the mode
fallback deletes pods built for another mode, and tells `Pod`-mode pods whose restart rules the
apiserver dropped from `Process`-mode pods that never had any."""

# Annotations on a GangJob, written by its user.
ANNOTATION_RESTART: Final = "gangjob.io/restart"
"""`<E>`: restart the gang, which runs at epoch E, once (`gangjob restart` writes it). Naming
the epoch makes the request idempotent: once the gang is past E it is satisfied, with nothing
to clear."""


class FailureAction(StrEnum):
    """What the gang does about a classified failure."""

    RESTART_GANG = "RestartGang"
    RECREATE_WORKER = "RecreateWorker"
    FAIL_JOB = "FailJob"
    IGNORE = "Ignore"


class RestartMode(StrEnum):
    """How workers restart: in place (`Pod`, `Process`) or by recreating the gang (`Recreate`).
    What each implies is its row of `RESTART_MODES`."""

    POD = "Pod"
    PROCESS = "Process"
    RECREATE = "Recreate"


class AgentPlacement(StrEnum):
    """Where the agent runs in a worker pod; the value is the agent's subcommand there."""

    SIDECAR = "sidecar"
    """A native sidecar (init container, `restartPolicy: Always`) beside the trainer, whose
    startup probe is the barrier."""
    WRAPPER = "wrap"
    """Inside the trainer's container, as its command, running the trainer as its child."""


FEATURE_RESTART_ALL_CONTAINERS: Final = "RestartAllContainersOnContainerExits"
"""What a node declares (`status.declaredFeatures`) when its kubelet does KEP-5532."""


@dataclass(frozen=True)
class ModeMeaning:
    """What one restart mode implies (docs/design.md section 3.7)."""

    in_place: bool
    """A gang restart keeps the workers' pods; otherwise it deletes and recreates them all."""
    agent: AgentPlacement
    restart_rules: bool
    """The agent's and the trainer's containers carry `RestartAllContainers` rules (KEP-5307,
    KEP-5532): the kubelet restarts the whole pod in place."""
    pods_restart_in_place: bool
    """The kubelet restarts pods in place, writing the restart's statuses asynchronously: an
    arrival can overtake them, so a worker at the epoch may show stale restart signals."""
    node_feature: str | None
    """What a node must declare for a worker of this mode to be scheduled there."""
    fallbacks: tuple[RestartMode, ...]
    """The modes tried in order when the cluster cannot honour this one; the first whose pods
    can be built is used."""


RESTART_MODES: Final[Mapping[RestartMode, ModeMeaning]] = {
    RestartMode.POD: ModeMeaning(
        in_place=True,
        agent=AgentPlacement.SIDECAR,
        restart_rules=True,
        pods_restart_in_place=True,
        node_feature=FEATURE_RESTART_ALL_CONTAINERS,
        fallbacks=(RestartMode.PROCESS, RestartMode.RECREATE),
    ),
    RestartMode.PROCESS: ModeMeaning(
        in_place=True,
        agent=AgentPlacement.WRAPPER,
        restart_rules=False,
        pods_restart_in_place=False,
        node_feature=None,
        fallbacks=(),
    ),
    RestartMode.RECREATE: ModeMeaning(
        in_place=False,
        agent=AgentPlacement.SIDECAR,
        restart_rules=False,
        pods_restart_in_place=False,
        node_feature=None,
        fallbacks=(),
    ),
}


HISTORY_LIMIT: Final = 10
"""`status.history` keeps the last this many restarts (the CRD rejects more)."""
AVOID_NODES_LIMIT: Final = 64
"""`status.avoidNodes` keeps the last this many nodes (the CRD rejects more): the status, and
the affinity of every pod created, must stay small."""
TAINT_SUSPECT: Final = "gangjob.io/suspect"
"""The NoSchedule taint of a node that keeps failing gangs (`--quarantine-nodes`); its value is
the class of most of its failures."""
ANNOTATION_SUSPECT_UNTIL: Final = "gangjob.io/suspect-until"
"""On a suspect node: when its taint expires (RFC 3339), and the controller lifts it."""
ANNOTATION_SUSPECT_CLEARED: Final = "gangjob.io/suspect-cleared-until"
"""On a node whose suspect taint someone took off before it expired: it is not tainted again
until then (RFC 3339)."""
STRAGGLERS_LIMIT: Final = 64
"""`status.progress.stragglers` lists at most this many ranks (the lowest; the `Stragglers`
condition counts them all): every agent receives every GangJob write."""

# Environment of every worker container.
ENV_MASTER_ADDR: Final = "MASTER_ADDR"
ENV_MASTER_PORT: Final = "MASTER_PORT"
ENV_WORLD_SIZE: Final = "WORLD_SIZE"
ENV_RANK: Final = "RANK"
ENV_GANGJOB_NAME: Final = "GANGJOB_NAME"
ENV_ROLE: Final = "GANGJOB_ROLE"
ENV_ROLE_INDEX: Final = "GANGJOB_ROLE_INDEX"
ENV_ROLE_REPLICAS: Final = "GANGJOB_ROLE_REPLICAS"

# What torchrun reads (`PET_<option>` is the default of its `--<option>`), in the trainer
# container of every ranked worker: a pod is one torchrun node (docs/torchrun.md).
ENV_PET_NNODES: Final = "PET_NNODES"
ENV_PET_NODE_RANK: Final = "PET_NODE_RANK"
ENV_PET_NPROC_PER_NODE: Final = "PET_NPROC_PER_NODE"
ENV_PET_MASTER_ADDR: Final = "PET_MASTER_ADDR"
ENV_PET_MASTER_PORT: Final = "PET_MASTER_PORT"
ENV_PET_MAX_RESTARTS: Final = "PET_MAX_RESTARTS"
"""0: the gang restart is GangJob's; torchrun restarting one node's workers alone would
desynchronise the gang."""
ENV_PET_RDZV_ID: Final = "PET_RDZV_ID"
"""Set by the agent where it starts the trainer (never in the pod's spec, which an in-place
restart keeps): `<job>-epoch-<E>`, the prefix of torchrun's rendezvous store keys, so a worker
of an older epoch can never join a newer group."""
NPROC_AUTO: Final = "auto"
"""`spec.nprocPerNode: auto`: the trainer container's GPU limit (`GPU_RESOURCES`)."""
GPU_RESOURCES: Final = ("nvidia.com/gpu", "amd.com/gpu")
"""Extended resources counted as GPUs by `nprocPerNode: auto`, first found wins."""


class ConditionType(StrEnum):
    """The `type` of the conditions in `status.conditions`."""

    READY = "Ready"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"
    MODE_DEGRADED = "ModeDegraded"
    """The cluster cannot honour `spec.restart.mode`; `status.mode` says what runs instead."""
    GANG_SCHEDULING = "GangScheduling"
    """True: kube-scheduler places the workers all-or-nothing (KEP-4671 PodGroup)."""
    STUCK = "Stuck"
    """True: the workers cannot do their part (controller/policy/stuck.py); the reason names
    the cause, the message the workers concerned and the fix."""
    ARRIVAL_DEGRADED = "ArrivalDegraded"
    """True: agents arrive by pod annotation although the controller serves the arrival
    endpoint: they cannot reach it."""
    STRAGGLERS = "Stragglers"
    """True: workers whose compute per step runs `spec.progress.straggler.ratio` times their
    role's median (controller/policy/straggler.py); the message names them, their pods and
    nodes."""


POD_CONDITION_TYPES: Final = (
    "PodScheduled",
    "PodReadyToStartContainers",
    "Initialized",
    "Ready",
    "ContainersReady",
    "DisruptionTarget",
    "PodResizePending",
    "PodResizeInProgress",
    "AllContainersRestarting",
)
"""The pod condition types Kubernetes sets: a failure rule's `onPodConditions[].type` is one of
them unless the matcher says `custom: true` (a typo would otherwise never match)."""
NODE_CONDITION_TYPES: Final = (
    "Ready",
    "MemoryPressure",
    "DiskPressure",
    "PIDPressure",
    "NetworkUnavailable",
)
"""The node condition types Kubernetes sets; `onNodeConditions[].type` likewise (a problem
detector's own, e.g. `GpuXidError`, with `custom: true`)."""


# Kueue's pod-group integration (sigs.k8s.io/kueue): a GangJob labelled with a queue name has
# its workers admitted by Kueue as one pod group (controller/policy/kueue.py).
KUEUE_QUEUE_NAME_LABEL: Final = "kueue.x-k8s.io/queue-name"
"""On a GangJob: the LocalQueue that admits it; copied onto its workers."""
KUEUE_POD_GROUP_NAME_LABEL: Final = "kueue.x-k8s.io/pod-group-name"
"""On a worker: its Kueue pod group, the GangJob's name (Kueue's Workload has that name)."""
KUEUE_POD_GROUP_TOTAL_COUNT_ANNOTATION: Final = "kueue.x-k8s.io/pod-group-total-count"
"""On a worker: how many pods the group has, `spec.replicas`."""
PLACEMENT_GATE: Final = "gangjob.io/placement"
"""A scheduling gate of ours on a new worker of a Kueue pod group that must keep off some nodes
(`avoidNodes`, nodes lost right now). Kueue's role hash, taken when the pod is created, covers
its affinity: the worker is created with its group's shape and this gate, then the controller
narrows its node affinity (allowed while a pod is gated) and lifts the gate."""
KUEUE_POD_FINALIZER: Final = "kueue.x-k8s.io/managed"
"""Kueue's finalizer on a pod-group member. Kueue lifts it from a Failed or deleted member only
once it sees the member's replacement; ours has the same name and cannot exist before the old
pod is gone, so the controller lifts it from the workers it deletes."""

# --- condition and Event reasons (CamelCase) ------------------------------------------------------
REASON_WORKERS_READY: Final = "AllWorkersReady"
REASON_WORKERS_NOT_READY: Final = "WorkersNotReady"
REASON_WORKERS_CREATED: Final = "WorkersCreated"
REASON_ALL_SUCCEEDED: Final = "AllWorkersSucceeded"
REASON_RANK0_SUCCEEDED: Final = "Rank0Succeeded"
REASON_ANY_SUCCEEDED: Final = "AnyWorkerSucceeded"
REASON_SUSPENDED: Final = "Suspended"
REASON_RESUMED: Final = "Resumed"
REASON_SUCCEEDED: Final = "Succeeded"
REASON_FAILED: Final = "Failed"
REASON_JOB_FINISHED: Final = "JobFinished"
REASON_STRAY_POD: Final = "StrayPod"
REASON_ELASTIC_AT_MINIMUM: Final = "ElasticAtMinimum"
"""Stuck: an elastic gang waits for workers no node can take, and cannot go on without them
(it is at `minReplicas`, or one is worker 0)."""
REASON_WORKER_REMOVED: Final = "WorkerRemoved"
"""A surplus worker's pod deleted by an elastic resize (docs/design.md section 3.12)."""
REASON_SPARE_TOOK_OVER: Final = "SpareTookOver"
"""A spare of an elastic gang took a recreated worker's place in the world (docs/design.md
section 3.12)."""
REASON_NON_RETRIABLE_EXIT: Final = "NonRetriableExitCode"
REASON_FAILURE_POLICY: Final = "FailurePolicy"
"""The job failed by a `FailJob` rule that matched something else than an exit code."""
REASON_MAX_RESTARTS: Final = "MaxRestartsExceeded"
REASON_DEADLINE_EXCEEDED: Final = "DeadlineExceeded"
"""The job ran longer than `spec.activeDeadlineSeconds`."""
REASON_GANG_RESTARTING: Final = "GangRestarting"
REASON_GANG_RESTARTED: Final = "GangRestarted"
REASON_BARRIER_OPEN: Final = "BarrierOpen"
REASON_GANG_POD_GROUP: Final = "PodGroupGangPolicy"
"""GangScheduling True: the workers are linked to a PodGroup with a gang policy."""
REASON_GANG_OFF: Final = "GangSchedulingOff"
"""GangScheduling False: `spec.scheduling.gang` is `Off`."""
REASON_GANG_NOT_SERVED: Final = "PodGroupAPINotServed"
"""GangScheduling False (and a Warning Event, once): the cluster does not serve the API."""
REASON_GANG_UNLINKED: Final = "WorkersOutsidePodGroup"
"""GangScheduling False: live workers were created without a PodGroup; the gang keeps that
until it is created whole again (a PodGroup's quorum would never count them)."""
REASON_GANG_ORDERED: Final = "RolesStartInOrder"
"""GangScheduling False: a role waits for another (`dependsOn`), so the gang is never whole at
once for a PodGroup's quorum."""
REASON_GANG_TOPOLOGY: Final = "PodGroupTopology"
"""GangScheduling True: the PodGroup also places every worker in one domain of
`spec.scheduling.topologyKey`."""
REASON_GANG_TOPOLOGY_NOT_SERVED: Final = "TopologyNotServed"
"""GangScheduling True (and a Warning Event, once): the gang is placed all-or-nothing, but the
cluster keeps no PodGroup topology constraint, so `spec.scheduling.topologyKey` is not
enforced."""
REASON_NO_DOMAIN_FITS: Final = "NoTopologyDomainFits"
"""Stuck: no domain of `spec.scheduling.topologyKey` can ever hold the whole gang."""
REASON_WORKER_RECREATED: Final = "WorkerRecreated"
REASON_FORCE_DELETED: Final = "ForceDeleted"
REASON_NODES_LACK_FEATURE: Final = "NodesLackRestartAllContainers"
REASON_RULES_DROPPED: Final = "RestartRulesDropped"
REASON_MODE_HONOURED: Final = "ModeHonoured"
REASON_MODE_CHANGED: Final = "RestartModeChanged"
REASON_INVALID_TEMPLATE: Final = "InvalidPodTemplate"
# Why a gang is stuck (condition `Stuck`, and a Warning Event when it turns True or its reason
# changes); the first that applies, in this order, is the reason.
REASON_POD_CREATION_REFUSED: Final = "PodCreationRefused"
"""The apiserver refused to create a worker pod (quota, admission webhook or policy, spec)."""
REASON_WORKER_RBAC_MISSING: Final = "WorkerRBACMissing"
"""The workers' ServiceAccount may not do what the agent needs (ClusterRole `gangjob-worker`
or its RoleBinding missing), by SubjectAccessReview."""
REASON_AGENT_IMAGE_PULL: Final = "AgentImagePullFailed"
"""The kubelet cannot pull the agent's image (ErrImagePull, ImagePullBackOff, ...)."""
REASON_IMAGE_PULL: Final = "ImagePullFailed"
"""The kubelet cannot pull the image of another container of a worker."""
REASON_AGENT_CRASHING: Final = "AgentCrashLooping"
"""The agent's sidecar container is in CrashLoopBackOff."""
REASON_BARRIER_STALLED: Final = "BarrierStalled"
"""Arrivals stopped short of every worker for longer than the controller's bound."""
REASON_PROGRESSING: Final = "Progressing"
"""Stuck False: the cause went away."""
REASON_ARRIVAL_UNREACHABLE: Final = "ArrivalEndpointUnreachable"
REASON_ARRIVALS_DIRECT: Final = "ArrivalsDirect"
"""ArrivalDegraded False: the workers arrived at the current epoch through the endpoint."""
REASON_NODE_SUSPECT: Final = "NodeSuspect"
"""On a Node: it was tainted `TAINT_SUSPECT` (`--quarantine-nodes`)."""
REASON_NODE_SUSPECT_LIFTED: Final = "NodeSuspectLifted"
"""On a Node: its suspect taint expired and was taken off."""
REASON_NODE_SUSPECT_CLEARED: Final = "NodeSuspectCleared"
"""On a Node: someone took its suspect taint off before it expired; it stays untainted."""
REASON_STRAGGLER: Final = "Straggler"
"""The Warning Event naming a worker found straggling, its pod and its node."""
REASON_STRAGGLERS_FOUND: Final = "StragglersFound"
"""Stragglers True."""
REASON_NO_STRAGGLERS: Final = "NoStragglers"
"""Stragglers False: the workers found straggling were recreated, restarted or caught up."""


# --- the agent's contract with the pod builder -------------------------------------------------
# The agent reads these (it is standard library only: its zipapp bundles this module with it), and
# controller.policy.podspec builds the pod to match.
RESTART_EXIT_CODE: Final = 86
"""`Pod` mode: the agent exits with this code when the gang moved to a newer epoch; the pod's
`RestartAllContainers` rule on the agent container matches exactly this code."""

ENV_POD_NAME: Final = "POD_NAME"
ENV_POD_NAMESPACE: Final = "POD_NAMESPACE"
ENV_AGENT_PORT: Final = "GANGJOB_AGENT_PORT"
ENV_DIR: Final = "GANGJOB_DIR"
ENV_KILL_GRACE_SECONDS: Final = "GANGJOB_KILL_GRACE_SECONDS"
ENV_POD_UID: Final = "POD_UID"
ENV_ARRIVAL_URL: Final = "GANGJOB_ARRIVAL_URL"
"""The controller's arrival endpoint (`http://host:port`); unset: arrive by annotation only."""
ENV_ARRIVAL_TOKEN: Final = "GANGJOB_ARRIVAL_TOKEN_FILE"
ENV_ARRIVAL_CA: Final = "GANGJOB_ARRIVAL_CA_FILE"
"""The CA bundle the agent verifies an `https://` arrival endpoint with (PEM); unset: the
system's trust store."""
ENV_ARRIVAL_CA_PEM: Final = "GANGJOB_ARRIVAL_CA_PEM"
"""The same CA as PEM text, as the pod builder gives it to every agent of a controller that
serves arrivals over TLS (the CA of its own certificate, or `--arrival-tls-ca-file`)."""
ENV_EPOCH: Final = "GANGJOB_EPOCH"
"""Set by the agent in the trainer's environment (`Process` mode): the epoch it runs at."""

ENV_PROGRESS: Final = "GANGJOB_PROGRESS"
"""In every trainer's environment: the file it writes its progress to, `step=<int>` lines with
optional ` compute=<seconds>` and ` checkpoint=<int>` (docs/progress.md)."""
ENV_HANG_SECONDS: Final = "GANGJOB_HANG_SECONDS"
"""The agent's: `spec.progress.hangSeconds`; unset or 0, the agent detects no stall."""
ENV_PROGRESS_SUMMARY_SECONDS: Final = "GANGJOB_PROGRESS_SUMMARY_SECONDS"
"""The agent's: at most one progress summary per this many seconds to the controller (default
`DEFAULT_PROGRESS_SUMMARY_SECONDS`); a builder may raise it for large gangs, whose summaries
cost the controller N / period requests a second."""
DEFAULT_PROGRESS_SUMMARY_SECONDS: Final = 30.0
"""As often as the controller writes a job's progress into its status, at most."""
COMPUTE_SHIFT_RATIO: Final = 1.25
"""A worker's compute shifted when its median moved by this factor, up or down: the agent
sends its summary at once, and the controller, which reads a summary alone as no news, looks
at the gang (a straggler may begin or end) (docs/progress.md)."""
ENV_PYTHONPATH: Final = "PYTHONPATH"
"""Where the agent starts the trainer, `$GANGJOB_DIR/python` goes first on it, so that the
trainer can `import gangjob_progress`."""

DEFAULT_AGENT_PORT: Final = 9445
DEFAULT_DIR: Final = "/gangjob"
DEFAULT_KILL_GRACE_SECONDS: Final = 10.0
EPOCH_FILE: Final = "epoch"
"""Name of the file in `$GANGJOB_DIR` holding the epoch whose barrier opened (decimal + LF)."""
WORLD_FILE: Final = "world"
"""Name of the file in `$GANGJOB_DIR` with the trainer's place in the epoch whose barrier
opened: `GANGJOB_EPOCH`, `RANK`, `WORLD_SIZE`, `PET_NODE_RANK`, `PET_NNODES`, one `NAME=value`
a line; written before `EPOCH_FILE` (docs/api.md "Elastic gangs")."""
ENV_AGENT_RANK: Final = "GANGJOB_RANK"
"""The agent sidecar's worker number (the pod's `gangjob.io/rank`), for an elastic gang: the
rank it gives its trainer at each epoch."""

PROGRESS_DIR: Final = "progress"
"""In `$GANGJOB_DIR`: the one directory the trainer writes to (its progress files and its stack
dumps). Emptied by the agent at every arrival, so that an epoch's progress starts blank."""
PROGRESS_FILE: Final = f"{PROGRESS_DIR}/steps"
"""`$GANGJOB_PROGRESS` is `$GANGJOB_DIR/progress/steps`. A torchrun local process writes
`steps.<LOCAL_RANK>` beside it (the helper does); the agent reads them all."""
STACKS_PREFIX: Final = "stacks."
"""`$GANGJOB_DIR/progress/stacks.<pid>`: a trainer process that registered the stack dump (the
helper's `faulthandler`); its first line `pid=<pid> start=<starttime>` names the process, and
the dump is appended below it on `STACKS_SIGNAL`."""
STACKS_SIGNAL: Final = "SIGUSR1"
"""What the agent sends a stalled trainer process that registered a stack dump."""
STACKS_FILE: Final = "stacks"
"""`$GANGJOB_DIR/stacks`: the stacks the agent collected at the last stall, whole."""
HELPER_DIR: Final = "python"
"""`$GANGJOB_DIR/python`: holds `gangjob_progress.py`, written by the agent at start."""
HELPER_MODULE: Final = "gangjob_progress"
"""The progress helper's module name: `import gangjob_progress` in the trainer."""
TRAINER_EXIT_FILE: Final = "trainer-exit"
"""In `$GANGJOB_DIR`, written by `agent.pyz launch` when its trainer exited 0: `<epoch>:0`. The
sidecar reports it as the trainer's exit, the controller counts the worker as succeeded, and the
launcher keeps the container running until the job has finished: the pod stays up, so a later
failure of another worker restarts this one in place too (docs/design.md section 3.2)."""
FINISHED_FILE: Final = "finished"
"""In `$GANGJOB_DIR`, written by the sidecar once the job has finished: a launcher holding the
container of a trainer that exited 0 then exits 0."""
ENV_LAUNCHED: Final = "GANGJOB_LAUNCHED"
"""`1` in the sidecar's environment when the trainer runs through `agent.pyz launch`: the sidecar
then reports the launcher's `TRAINER_EXIT_FILE` and writes `FINISHED_FILE`."""
LAUNCH_POLL_SECONDS: Final = 0.5
"""How often the launcher and the sidecar look at each other's file (the standard library has
no file watch)."""

BARRIER_PATH: Final = "/barrier"
"""Probe path: 200 once the barrier of the agent's epoch is open, else 503."""
HEALTHZ_PATH: Final = "/healthz"

STATE_FILE: Final = ".gangjob-agent.json"
"""In `$GANGJOB_DIR` (kept across a KEP-5532 restart of the pod): the pod UID, the epoch the
agent last arrived at and the newest `status.epoch` it saw, so that a restarted agent knows
where it stands without reading its pod and its GangJob."""

ARRIVALS_PATH: Final = "/v1/arrivals"
"""The controller's arrival endpoint (docs/design.md section 3): POST a report, read the
GangJob's state as a stream of JSON lines while the report holds."""
PIPELINING_HEADER: Final = "Gangjob-Pipelining"
"""A header of the arrival stream's answer: with the value `PIPELINING_SUPERSEDES`, the agent may
send its next report on the stream's connection before the stream ends; the controller then ends
the stream (the report supersedes it) at a chunk's boundary and answers the report next on that
connection (HTTP/1.1 pipelining), so that the agent holds one connection for its life."""
PIPELINING_SUPERSEDES: Final = "supersedes"
PROGRESS_PATH: Final = "/v1/progress"
"""The controller's progress endpoint, beside `ARRIVALS_PATH` and with the same token: POST one
summary of a worker's training progress (docs/progress.md); answered 204, no stream."""
ARRIVAL_AUDIENCE: Final = "gangjob.io/arrival"
"""Audience of the projected service-account token the agent shows the controller: the
apiserver rejects it for anything else, so a leaked one opens nothing but this endpoint."""
DEFAULT_ARRIVAL_TOKEN: Final = "/var/run/secrets/gangjob.io/arrival/token"

SERVICE_ACCOUNT_DIR: Final = "/var/run/secrets/kubernetes.io/serviceaccount"

UNKNOWN_EXIT_CODE: Final = -1
"""Reported as `gangjob.io/exit: "<E>:-1"` by an agent whose pod restarted under it at an epoch
it had arrived at: the trainer failed at E, and the kubelet kept no exit code (KEP-5532). The
controller may have missed the moment (it was down); this report is the durable trace."""

# --- what only the pod builder names --------------------------------------------------------------

AGENT_CONTAINER: Final = "gangjob-agent"
"""`Pod` and `Recreate` modes: the agent as a native sidecar (restartable init container)."""
AGENT_INSTALL_CONTAINER: Final = "gangjob-agent-install"
"""`Process` mode, and the torchrun launch of the other modes: the init container that copies the
agent's zipapp into the shared volume."""
AGENT_PORT_NAME: Final = "gangjob-agent"
AGENT_VOLUME: Final = "gangjob"
"""The emptyDir mounted at `DEFAULT_DIR`: the agent writes the `epoch` file there (and, in
`Process` mode, the zipapp is copied there)."""
AGENT_TOKEN_VOLUME: Final = "gangjob-token"
ARRIVAL_TOKEN_VOLUME: Final = "gangjob-arrival-token"
"""A token bound to the pod for the audience `gangjob.io/arrival`: the agent shows it to the
controller's arrival endpoint (controller.arrivals), and it opens nothing else."""
ARRIVAL_TOKEN_SECONDS: Final = 3600
AGENT_IMAGE_ZIPAPP: Final = "/opt/gangjob/agent.pyz"
"""Where the agent image holds the zipapp; its entrypoint is `python3` on it."""
WRAPPED_ZIPAPP: Final = f"{DEFAULT_DIR}/agent.pyz"
WORKER_SERVICE_ACCOUNT: Final = "gangjob-worker"
"""The ServiceAccount of worker pods whose template names none (see controller.workeraccess)."""
WORKER_ROLE_FILE: Final = "manifests/rbac/worker_role.yaml"
"""The ClusterRole `gangjob-worker` its RoleBindings grant, as the messages that ask a user to
install it name it."""

AGENT_RESOURCES: Final[Mapping[str, str]] = {"cpu": "100m", "memory": "64Mi"}
"""Requests of the agent containers: an idle asyncio process holding one watch (~25 MiB RSS).
The CPU is not for steady state but for Python's start-up on every restart, which a 10m share
would stretch to seconds."""
BARRIER_PROBE_SLACK_SECONDS: Final = 60
"""The barrier probe outlasts `spec.restart.barrierTimeoutSeconds` by this much, so that the
controller, not the kubelet, acts on a worker that never arrives: a failed startup probe would
kill the waiting agent and make it look failed at an epoch it never ran."""
