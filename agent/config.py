"""The agent's configuration: which pod and GangJob it serves, where it writes the epoch, its
probe port, its timings and how it follows the trainer's progress. From the pod's environment,
or given directly in-process."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from api.constants import (
    DEFAULT_AGENT_PORT,
    DEFAULT_ARRIVAL_TOKEN,
    DEFAULT_DIR,
    DEFAULT_KILL_GRACE_SECONDS,
    DEFAULT_PROGRESS_SUMMARY_SECONDS,
    ENV_AGENT_PORT,
    ENV_AGENT_RANK,
    ENV_ARRIVAL_CA,
    ENV_ARRIVAL_CA_PEM,
    ENV_ARRIVAL_TOKEN,
    ENV_ARRIVAL_URL,
    ENV_DIR,
    ENV_GANGJOB_NAME,
    ENV_HANG_SECONDS,
    ENV_KILL_GRACE_SECONDS,
    ENV_LAUNCHED,
    ENV_POD_NAME,
    ENV_POD_NAMESPACE,
    ENV_POD_UID,
    ENV_PROGRESS_SUMMARY_SECONDS,
    ENV_ROLE,
    GROUP,
    PLURAL,
    VERSION,
)

PROGRESS_POLL_SECONDS = 1.0
"""A pod's agent reads its trainer's progress files this often (a `stat` each when unchanged)."""


class ConfigError(ValueError):
    """The environment lacks or garbles a setting; the message names the variable."""


@dataclass(frozen=True)
class Config:
    job_name: str
    pod_name: str
    namespace: str
    dir: Path = Path(DEFAULT_DIR)
    """Shared with the trainer (an emptyDir in a pod): the agent writes `epoch` there."""
    probe_port: int | None = DEFAULT_AGENT_PORT
    """`Pod` mode's barrier probe; 0 picks a free port, None serves none (in-process fleets)."""
    probe_host: str = "0.0.0.0"
    kill_grace_seconds: float = DEFAULT_KILL_GRACE_SECONDS
    """`Process` mode: SIGTERM to SIGKILL of the trainer's process group."""
    watch_timeout_seconds: int = 300
    """Asked of the apiserver per watch; each agent adds up to as much again at random, so a
    fleet started together does not reconnect together."""
    watch_inactivity_seconds: float = 90.0
    """A watch silent this long is dead. Above the apiserver's ~60 s bookmark period."""
    backoff_initial: float = 0.2
    backoff_max: float = 10.0
    pod_uid: str = ""
    """The pod's UID (downward API): names the pod to the controller and keys the state file."""
    arrival_url: str | None = None
    """The controller's arrival endpoint; None: arrive by annotation and watch the apiserver."""
    arrival_token_file: Path = Path(DEFAULT_ARRIVAL_TOKEN)
    """The projected token (audience `gangjob.io/arrival`) shown to the controller."""
    arrival_ca_file: Path | None = None
    """The CA the agent verifies an `https://` endpoint's certificate with; None: the system's
    trust store. The token travels only inside the verified connection."""
    arrival_ca_pem: str | None = None
    """The same CA as PEM text (`GANGJOB_ARRIVAL_CA_PEM`, as the pod builder gives it); taken
    before `arrival_ca_file`."""
    role: str | None = None
    """The worker's role (`GANGJOB_ROLE`): once it is `Complete`, a worker that succeeded is
    done, though the job runs on."""
    launched: bool = False
    """The trainer runs through `agent.pyz launch` (`ENV_LAUNCHED`): the sidecar reports the
    launcher's exit file and tells it when the job has finished."""
    rank: int | None = None
    """An elastic gang's worker's rank (`GANGJOB_RANK`, its pod's `gangjob.io/rank`): given to
    the trainer with the epoch's `WORLD_SIZE` (docs/design.md section 3.12). None (any other
    gang): the pod's environment stands."""
    direct_fallback_seconds: float = 5.0
    """How long the agent keeps trying the controller's endpoint before it arrives by
    annotation instead (and watches the apiserver)."""
    progress_poll_seconds: float | None = None
    """How often the agent reads its trainer's progress files (docs/progress.md); None: it does
    not follow progress (in-process fleets of thousands). A pod's agent polls every
    `PROGRESS_POLL_SECONDS`."""
    progress_summary_seconds: float = DEFAULT_PROGRESS_SUMMARY_SECONDS
    """At most one progress summary per this many seconds goes to the controller (a stall and
    its end at once)."""
    hang_seconds: float | None = None
    """No step for this long while the trainer runs is a stall; None: never."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Config:
        """From a pod's environment (names through the downward API)."""
        env = os.environ if env is None else env

        def need(name: str) -> str:
            value = env.get(name, "").strip()
            if not value:
                raise ConfigError(f"{name} is not set (the pod builder passes it)")
            return value

        def number(name: str, default: float) -> float:
            raw = env.get(name, "").strip()
            if not raw:
                return default
            try:
                value = float(raw)
            except ValueError:
                raise ConfigError(f"{name}={raw!r}: not a number") from None
            if value < 0:
                raise ConfigError(f"{name}={raw!r}: must not be negative")
            return value

        port = number(ENV_AGENT_PORT, DEFAULT_AGENT_PORT)
        if port != int(port) or not 0 < port < 65536:
            raise ConfigError(f"{ENV_AGENT_PORT}={env.get(ENV_AGENT_PORT)!r}: not a port")
        arrival_url = env.get(ENV_ARRIVAL_URL, "").strip() or None
        if arrival_url is not None:
            if not arrival_url.startswith(("http://", "https://")):
                raise ConfigError(f"{ENV_ARRIVAL_URL}={arrival_url!r}: not an http(s) URL")
            need(ENV_POD_UID)  # the controller is told which pod reports by its UID
        arrival_ca = env.get(ENV_ARRIVAL_CA, "").strip() or None
        arrival_ca_pem = env.get(ENV_ARRIVAL_CA_PEM, "").strip() or None
        for name, value in ((ENV_ARRIVAL_CA, arrival_ca), (ENV_ARRIVAL_CA_PEM, arrival_ca_pem)):
            if value is not None and not (arrival_url or "").startswith("https://"):
                raise ConfigError(
                    f"{name} is set but {ENV_ARRIVAL_URL}={arrival_url!r} is not https://"
                )
        raw_rank = env.get(ENV_AGENT_RANK, "").strip()
        if raw_rank and not raw_rank.isdigit():
            raise ConfigError(f"{ENV_AGENT_RANK}={raw_rank!r}: not a rank")
        return cls(
            job_name=need(ENV_GANGJOB_NAME),
            rank=int(raw_rank) if raw_rank else None,
            pod_name=need(ENV_POD_NAME),
            namespace=need(ENV_POD_NAMESPACE),
            dir=Path(env.get(ENV_DIR, "").strip() or DEFAULT_DIR),
            probe_port=int(port),
            kill_grace_seconds=number(ENV_KILL_GRACE_SECONDS, DEFAULT_KILL_GRACE_SECONDS),
            pod_uid=env.get(ENV_POD_UID, "").strip(),
            launched=env.get(ENV_LAUNCHED, "").strip() == "1",
            role=env.get(ENV_ROLE, "").strip() or None,
            arrival_url=arrival_url,
            arrival_token_file=Path(
                env.get(ENV_ARRIVAL_TOKEN, "").strip() or DEFAULT_ARRIVAL_TOKEN
            ),
            arrival_ca_file=Path(arrival_ca) if arrival_ca is not None else None,
            arrival_ca_pem=arrival_ca_pem,
            progress_poll_seconds=PROGRESS_POLL_SECONDS,
            hang_seconds=number(ENV_HANG_SECONDS, 0.0) or None,
            progress_summary_seconds=number(
                ENV_PROGRESS_SUMMARY_SECONDS, DEFAULT_PROGRESS_SUMMARY_SECONDS
            ),
        )

    @property
    def jobs_path(self) -> str:
        return f"/apis/{GROUP}/{VERSION}/namespaces/{self.namespace}/{PLURAL}"

    @property
    def pod_path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods/{self.pod_name}"
