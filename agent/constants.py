"""The protocol names the agent needs, mirrored from `api.constants` (DESIGN.md section 3).

The agent is standard library only and ships alone as a zipapp, so it cannot import `api`; a
unit test keeps these equal to `api.constants`. Also owns the agent's own contract with the
pod builder: its exit code, environment variables, probe port and paths.
"""

from typing import Final

GROUP: Final = "gangjob.io"
VERSION: Final = "v1alpha1"
PLURAL: Final = "gangjobs"

ANNOTATION_EPOCH: Final = "gangjob.io/epoch"
"""The epoch this worker has arrived at (decimal integer), on the agent's own pod."""
ANNOTATION_EXIT: Final = "gangjob.io/exit"
"""`Process` mode: the trainer's last exit, as `<epoch>:<code>`."""

ENV_GANGJOB_NAME: Final = "GANGJOB_NAME"

# The agent's own contract with the pod builder (not in api.constants: only the agent and the
# pod builder use them, and the builder imports them from here).
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
ENV_EPOCH: Final = "GANGJOB_EPOCH"
"""Set by the agent in the trainer's environment (`Process` mode): the epoch it runs at."""

DEFAULT_AGENT_PORT: Final = 9445
DEFAULT_DIR: Final = "/gangjob"
DEFAULT_KILL_GRACE_SECONDS: Final = 10.0
EPOCH_FILE: Final = "epoch"
"""Name of the file in `$GANGJOB_DIR` holding the epoch whose barrier opened (decimal + LF)."""

BARRIER_PATH: Final = "/barrier"
"""Probe path: 200 once the barrier of the agent's epoch is open, else 503."""
HEALTHZ_PATH: Final = "/healthz"

STATE_FILE: Final = ".gangjob-agent.json"
"""In `$GANGJOB_DIR` (kept across a KEP-5532 restart of the pod): the pod UID, the epoch the
agent last arrived at and the newest `status.epoch` it saw, so that a restarted agent knows
where it stands without reading its pod and its GangJob."""

ARRIVALS_PATH: Final = "/v1/arrivals"
"""The controller's arrival endpoint (DESIGN.md section 3, "Scale"): POST a report, read the
GangJob's state as a stream of JSON lines while the report holds."""
ARRIVAL_AUDIENCE: Final = "gangjob.io/arrival"
"""Audience of the projected service-account token the agent shows the controller: the
apiserver rejects it for anything else, so a leaked one opens nothing but this endpoint."""
DEFAULT_ARRIVAL_TOKEN: Final = "/var/run/secrets/gangjob.io/arrival/token"

SERVICE_ACCOUNT_DIR: Final = "/var/run/secrets/kubernetes.io/serviceaccount"

UNKNOWN_EXIT_CODE: Final = -1
"""Reported as `gangjob.io/exit: "<E>:-1"` by an agent whose pod restarted under it at an epoch
it had arrived at: the trainer failed at E, and the kubelet kept no exit code (KEP-5532). The
controller may have missed the moment (it was down); this report is the durable trace."""
