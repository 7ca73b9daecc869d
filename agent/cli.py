"""The agent's command line, as the pod runs it:

    python3 -m agent sidecar              # Pod mode: native sidecar, barrier probe
    python3 -m agent wrap -- CMD ARGS...  # Process mode: runs CMD, restarts it per epoch
    python3 agent.pyz sidecar             # the same from the zipapp
    python3 agent.pyz launch -- CMD ...   # Pod/Recreate mode with spec.nprocPerNode: runs CMD
                                          # with the epoch's GANGJOB_EPOCH and PET_RDZV_ID; once
                                          # it exited 0, holds the container until the job ends

Reads its settings from the pod's environment (`Config.from_env`, the service account) and
turns the agent's outcome into the process exit code.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from agent.agent import Agent
from agent.apiclient import HttpClient
from agent.config import Config, ConfigError
from agent.launch import hold, launch
from agent.monitor import trainer_env
from agent.protocol import outside_world, read_world_file, rendezvous_id
from agent.trainer import become_subreaper
from api.constants import (
    DEFAULT_AGENT_PORT,
    DEFAULT_DIR,
    DEFAULT_KILL_GRACE_SECONDS,
    DEFAULT_PROGRESS_SUMMARY_SECONDS,
    ENV_AGENT_PORT,
    ENV_ARRIVAL_CA,
    ENV_ARRIVAL_CA_PEM,
    ENV_ARRIVAL_TOKEN,
    ENV_ARRIVAL_URL,
    ENV_DIR,
    ENV_EPOCH,
    ENV_GANGJOB_NAME,
    ENV_HANG_SECONDS,
    ENV_KILL_GRACE_SECONDS,
    ENV_PET_RDZV_ID,
    ENV_POD_NAME,
    ENV_POD_NAMESPACE,
    ENV_POD_UID,
    ENV_PROGRESS,
    ENV_PROGRESS_SUMMARY_SECONDS,
    EPOCH_FILE,
    RESTART_EXIT_CODE,
    WORLD_FILE,
    AgentPlacement,
)

USAGE_EXIT_CODE = 2

EPILOG = f"""\
environment:
  {ENV_GANGJOB_NAME}, {ENV_POD_NAME}, {ENV_POD_NAMESPACE}   required (downward API)
  {ENV_POD_UID}   the pod's UID (downward API): keys the state file kept across restarts
  {ENV_ARRIVAL_URL}, {ENV_ARRIVAL_TOKEN}   the controller's arrival endpoint and the
      token for it (audience gangjob.io/arrival); unset: arrive by pod annotation
  {ENV_ARRIVAL_CA}   the CA (PEM) an https:// arrival endpoint is verified with
      (default: the system's trust store); {ENV_ARRIVAL_CA_PEM}: the CA itself, first
  {ENV_AGENT_PORT}   barrier probe port (sidecar; default {DEFAULT_AGENT_PORT})
  {ENV_DIR}   shared directory for the `epoch` file (default {DEFAULT_DIR})
  {ENV_KILL_GRACE_SECONDS}   SIGTERM to SIGKILL of the trainer (wrap; default \
{DEFAULT_KILL_GRACE_SECONDS:g})
  KUBERNETES_SERVICE_HOST/_PORT and the service account reach the apiserver.
  {ENV_HANG_SECONDS}   no progress for this long is a stall (default: never)
  {ENV_PROGRESS_SUMMARY_SECONDS}   at most one progress summary to the controller per this
      many seconds (default {DEFAULT_PROGRESS_SUMMARY_SECONDS:g})
The trainer gets {ENV_EPOCH} and {ENV_PET_RDZV_ID} (wrap, launch; launch reads the epoch from
{ENV_DIR}/{EPOCH_FILE}, written when the barrier opened, and needs only {ENV_GANGJOB_NAME}),
and {ENV_PROGRESS}, the file to report its steps to (docs/progress.md).
Exit codes: sidecar {RESTART_EXIT_CODE} = the gang moved to a
new epoch (restart the pod); wrap = the trainer's code once done or failed for good.
"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="agent",
        description="GangJob in-pod agent: arrives at restart epochs and holds the barrier.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="mode", required=True, metavar="{sidecar,wrap,launch}")
    sub.add_parser(
        AgentPlacement.SIDECAR, help="Pod mode: native sidecar serving the barrier probe"
    )
    wrap = sub.add_parser(
        AgentPlacement.WRAPPER, help="Process mode: run and restart the trainer command"
    )
    wrap.add_argument("command", nargs=argparse.REMAINDER, help="-- the trainer's argv")
    launch = sub.add_parser(
        "launch", help="run the trainer command with the epoch's rendezvous id (torchrun)"
    )
    launch.add_argument("command", nargs=argparse.REMAINDER, help="-- the trainer's argv")
    return p


class _Launch(NamedTuple):
    """What `launch` reads at its start: the sidecar's directory, the epoch it opened, that
    epoch's `world` file and the trainer's environment."""

    directory: Path
    epoch: int
    world: dict[str, str]
    env: dict[str, str]


def _read_launch(env: Mapping[str, str]) -> _Launch:
    """Raises ValueError naming what is missing."""
    job = env.get(ENV_GANGJOB_NAME, "").strip()
    if not job:
        raise ValueError(f"{ENV_GANGJOB_NAME} is not set")
    directory = Path(env.get(ENV_DIR, "").strip() or DEFAULT_DIR)
    path = directory / EPOCH_FILE
    try:
        epoch = int(path.read_text().strip())
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read the epoch from {path}: {e}") from e
    # An elastic gang's sidecar writes the epoch's world (RANK, WORLD_SIZE) before the epoch.
    try:
        world = read_world_file((directory / WORLD_FILE).read_text())
    except OSError:
        world = {}
    if world.get(ENV_EPOCH) != str(epoch):
        world = {}  # another epoch's, or none: the pod's environment stands
    # The sidecar prepared the progress directory and the helper when it arrived.
    trainer = {
        **trainer_env(directory, env),
        **world,
        ENV_EPOCH: str(epoch),
        ENV_PET_RDZV_ID: rendezvous_id(job, epoch),
    }
    return _Launch(directory, epoch, world, trainer)


def launch_env(env: Mapping[str, str]) -> dict[str, str]:
    """The trainer's environment for `launch`: `env` with the epoch of `$GANGJOB_DIR/epoch`, its
    rendezvous id and the progress contract (`GANGJOB_PROGRESS`, the helper on `PYTHONPATH`).
    Raises ValueError naming what is missing."""
    return _read_launch(env).env


def run_launch(command: Sequence[str], env: Mapping[str, str]) -> int:
    """`launch`: runs `command` at the epoch the sidecar opened; outside that epoch's world
    (a spare), holds instead, and launches at a later epoch only if one comes without the
    pod restarting (`launch.hold`)."""
    while True:
        try:
            at = _read_launch(env)
        except ValueError as e:
            print(f"agent: error: launch: {e}", file=sys.stderr)
            return USAGE_EXIT_CODE
        if not outside_world(at.world, at.epoch):
            return launch(command, at.env, at.directory, at.epoch)
        if hold(at.directory, at.epoch):
            return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    command: list[str] = list(getattr(args, "command", None) or [])
    if command and command[0] == "--":
        command = command[1:]
    if args.mode in ("wrap", "launch") and not command:
        print(f"agent: error: {args.mode} needs the trainer's command after --", file=sys.stderr)
        return USAGE_EXIT_CODE
    if args.mode == "launch":
        return run_launch(command, os.environ)
    logging.basicConfig(level=logging.INFO, format="agent: %(message)s", stream=sys.stderr)
    try:
        config = Config.from_env()
        api = HttpClient.in_cluster()
    except (ConfigError, ValueError, OSError) as e:
        print(f"agent: error: {e}", file=sys.stderr)
        return USAGE_EXIT_CODE
    mode = AgentPlacement(args.mode)
    # `wrap` takes in what its trainer runs leave behind: it is the container's PID 1, or
    # becomes the subreaper of its descendants, and has no children but the trainer's.
    adopts = mode is AgentPlacement.WRAPPER and (os.getpid() == 1 or become_subreaper())
    agent = Agent(config, api, mode=mode, command=command, adopts_orphans=adopts)
    return asyncio.run(_run(agent))


async def _run(agent: Agent) -> int:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, agent.stop)
    agent.log.info(
        "starting: %s mode, pod %s/%s, gangjob %s",
        agent.mode,
        agent.config.namespace,
        agent.config.pod_name,
        agent.config.job_name,
    )
    code = await agent.run()
    agent.log.info("exiting with code %d", code)
    return code
