"""Protocol names of GangJob (DESIGN.md sections 3 and 3b): API group and resource names, the
labels and annotations on worker pods, condition types and worker environment variables.

Standard library only, so that any layer (and a copy in the agent) can use these strings.
"""

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

# Annotations on a worker pod, written by the agent on its own pod only.
ANNOTATION_EPOCH: Final = "gangjob.io/epoch"
"""The epoch this worker has arrived at (decimal integer)."""
ANNOTATION_EXIT: Final = "gangjob.io/exit"
"""`Process` mode: the trainer's last exit, as `<epoch>:<code>`."""

HISTORY_LIMIT: Final = 10
"""`status.history` keeps the last this many restarts (the CRD rejects more)."""
AVOID_NODES_LIMIT: Final = 64
"""`status.avoidNodes` keeps the last this many nodes (the CRD rejects more): the status, and
the affinity of every pod created, must stay small."""

# Environment of every worker container.
ENV_MASTER_ADDR: Final = "MASTER_ADDR"
ENV_MASTER_PORT: Final = "MASTER_PORT"
ENV_WORLD_SIZE: Final = "WORLD_SIZE"
ENV_RANK: Final = "RANK"
ENV_GANGJOB_NAME: Final = "GANGJOB_NAME"


class ConditionType(StrEnum):
    """The `type` of the conditions in `status.conditions`."""

    READY = "Ready"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"
    MODE_DEGRADED = "ModeDegraded"
    """The cluster cannot honour `spec.restart.mode`; `status.mode` says what runs instead."""
