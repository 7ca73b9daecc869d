"""`gangjob`: submit a GangJob, follow it, restart it, delete it, with your kubeconfig.

    gangjob submit --image IMG --workers 2 --processes 2 -- torchrun train.py
    gangjob status JOB
    gangjob logs JOB --rank 1 -f
    gangjob restart JOB
    gangjob delete JOB

Talks to the cluster through the project's API client (`controller.k8s`) and builds GangJobs
with the one builder (`api.builders`), so a job it submits is one a user would write.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import string
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

import yaml

from api import builders
from api.constants import ANNOTATION_RESTART, NPROC_AUTO
from api.v1alpha1 import RestartMode
from cli.logs import TERMINAL, logs
from cli.render import status_lines
from controller.k8s import CONFIGMAPS, GANGJOBS, ApiError, JsonDict, Kube, NotFound

EXIT_ERROR = 1
EXIT_USAGE = 2
PROGRAM_DIR = "/program"
PROGRAM_VOLUME = "program"
CHECKPOINTS_DIR = "/checkpoints"
CHECKPOINTS_VOLUME = "checkpoints"


# --- the parser ---------------------------------------------------------------------------------


def _processes(value: str) -> int | str:
    if value == NPROC_AUTO:
        return value
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1 or {NPROC_AUTO!r}")
    return number


def _env(value: str) -> tuple[str, str]:
    name, sep, val = value.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError("must be NAME=VALUE")
    return name, val


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)"
    )
    common.add_argument("--context", help="kubeconfig context (default: the current one)")
    common.add_argument(
        "-n", "--namespace", help="namespace (default: the context's, else `default`)"
    )

    p = argparse.ArgumentParser(
        prog="gangjob",
        description="Run distributed training as a GangJob: a gang of worker pods that restarts "
        "in place, together, when one fails. Uses your kubeconfig.",
        epilog="`gangjob COMMAND --help` documents each command.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    submit = sub.add_parser(
        "submit",
        parents=[common],
        help="create a GangJob from flags or a file; prints its name",
        description="Create a GangJob and print its name. Either from flags: the trainer image, "
        "the number of workers (pods) and processes per worker, and the trainer's command after "
        "`--` (each worker gets MASTER_ADDR, WORLD_SIZE, RANK and torchrun's PET_* variables: "
        "`torchrun train.py` needs no flags); or from a manifest (`-f`).",
        epilog="example: gangjob submit --image my/trainer:1 --workers 2 --processes 2 "
        "--env EPOCHS=10 -- torchrun train.py",
    )
    submit.add_argument("-f", "--filename", type=Path, help="a GangJob manifest (YAML or JSON)")
    submit.add_argument("--name", help="the job's name (default: `train-` and 5 random letters)")
    submit.add_argument("--image", help="the trainer's container image")
    submit.add_argument("--workers", type=int, help="the gang's size: pods, one per node")
    submit.add_argument(
        "--processes",
        type=_processes,
        help=f"processes per worker (spec.nprocPerNode): an integer, or {NPROC_AUTO!r} for the "
        "worker's GPUs (default: 1)",
    )
    submit.add_argument(
        "--gpus", type=int, default=0, help="nvidia.com/gpu each worker asks for (default: 0)"
    )
    submit.add_argument(
        "--mode",
        choices=[m.value for m in RestartMode],
        help="restart mode (default: Pod, the pod restarts in place)",
    )
    submit.add_argument("--max-restarts", type=int, help="counted restarts before the job fails")
    submit.add_argument(
        "--env", type=_env, action="append", default=[], metavar="NAME=VALUE",
        help="an environment variable of the trainer (repeatable)",
    )  # fmt: skip
    submit.add_argument(
        "--program", type=Path, action="append", default=[], metavar="FILE",
        help=f"a file of your program (repeatable, e.g. train.py): put into the ConfigMap "
        f"<job>-program, which the job owns, and mounted at {PROGRAM_DIR}, the trainer's "
        "working directory; so the image needs only the libraries",
    )  # fmt: skip
    submit.add_argument(
        "--checkpoints", metavar="PATH|pvc:CLAIM",
        help=f"a directory every worker shares, mounted at {CHECKPOINTS_DIR}: a host path (on a "
        "one-node cluster such as the local one), or `pvc:CLAIM`, a ReadWriteMany "
        "PersistentVolumeClaim",
    )  # fmt: skip
    submit.add_argument("trainer_command", nargs="*", metavar="-- COMMAND", help="the trainer")

    status = sub.add_parser(
        "status",
        parents=[common],
        help="a job's phase, epoch, barrier, workers and restart history",
        description="Print the job's phase, epoch, barrier epoch, workers ready/arrived/existing "
        "and restart mode, then every restart of its history (the last 10, and the one in "
        "progress) with its trigger, class, action and duration.",
    )
    status.add_argument("job", help="the GangJob's name")

    logs = sub.add_parser(
        "logs",
        parents=[common],
        help="the trainer's log of one rank, across in-place restarts",
        description="Print the trainer container's log of the worker of rank R (pod JOB-R). With "
        "-f, follow it: across in-place restarts of the gang (a Pod-mode restart starts a new "
        "container, whose log follows the old one's), until the job ends.",
    )
    logs.add_argument("job", help="the GangJob's name")
    logs.add_argument("--rank", type=int, default=0, help="the worker's rank (default: 0)")
    logs.add_argument("-f", "--follow", action="store_true", help="follow until the job ends")

    restart = sub.add_parser(
        "restart",
        parents=[common],
        help="restart the whole gang in place, once",
        description="Ask the controller for one gang restart: it annotates the GangJob with "
        f"{ANNOTATION_RESTART}=<its current epoch>; the controller raises the epoch once, every "
        "worker restarts in place and the history records a ManualRestart. Asking twice at the "
        "same epoch restarts once.",
    )
    restart.add_argument("job", help="the GangJob's name")
    restart.add_argument(
        "--wait", action="store_true", help="wait until the gang has restarted (barrier open)"
    )

    delete = sub.add_parser(
        "delete",
        parents=[common],
        help="delete a GangJob and its pods",
        description="Delete the GangJob; its worker pods and Service go with it.",
    )
    delete.add_argument("job", help="the GangJob's name")
    return p


# --- the commands -------------------------------------------------------------------------------


class UsageError(Exception):
    """A command line that cannot be run; the message names the flag and the rule."""


def context_namespace(kubeconfig: str | None, context: str | None) -> str:
    """The namespace of the kubeconfig's context, as kubectl takes it; `default` without one."""
    path = kubeconfig or (os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or None)
    file = Path(path) if path else Path.home() / ".kube" / "config"
    try:
        config = yaml.safe_load(file.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return "default"
    name = context or config.get("current-context")
    for entry in config.get("contexts") or []:
        if entry.get("name") == name:
            return str((entry.get("context") or {}).get("namespace") or "default")
    return "default"


def random_name() -> str:
    suffix = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(5))
    return f"train-{suffix}"


def manifest_from_args(args: argparse.Namespace, namespace: str) -> JsonDict:
    """The GangJob of `submit`'s flags, by `api.builders.gangjob`; or the one of `-f`."""
    if args.filename is not None:
        given = ("image", "workers", "processes", "mode", "checkpoints")
        flags = [f"--{f}" for f in given if getattr(args, f)]
        if args.trainer_command:
            flags.append("COMMAND")
        if flags:
            raise UsageError(f"-f: the manifest gives the job; not with {', '.join(flags)}")
        body: JsonDict = yaml.safe_load(args.filename.read_text())
        body.setdefault("metadata", {}).setdefault("namespace", namespace)
        if args.name:
            body["metadata"]["name"] = args.name
        return body
    if not args.image:
        raise UsageError("--image: required (or -f FILE)")
    if not args.workers or args.workers < 1:
        raise UsageError("--workers: required, an integer >= 1")
    if not args.trainer_command:
        raise UsageError("COMMAND: give the trainer's command after `--`")
    container: JsonDict = {}
    if args.env:
        container["env"] = [{"name": k, "value": v} for k, v in args.env]
    if args.gpus:
        gpus = {"nvidia.com/gpu": str(args.gpus)}
        container["resources"] = {"limits": gpus, "requests": dict(gpus)}
    name = args.name or random_name()
    pod_spec: JsonDict = {}
    if args.program:
        container["workingDir"] = PROGRAM_DIR
        mount = {"name": PROGRAM_VOLUME, "mountPath": PROGRAM_DIR, "readOnly": True}
        container["volumeMounts"] = [mount]
        volume = {"name": PROGRAM_VOLUME, "configMap": {"name": program_configmap(name)}}
        pod_spec["volumes"] = [volume]
    if args.checkpoints:
        mount = {"name": CHECKPOINTS_VOLUME, "mountPath": CHECKPOINTS_DIR}
        container["volumeMounts"] = [*container.get("volumeMounts", []), mount]
        pod_spec["volumes"] = [*pod_spec.get("volumes", []), checkpoints_volume(args.checkpoints)]
    spec: JsonDict = {}
    if args.processes is not None:
        spec["nprocPerNode"] = args.processes
    return builders.gangjob(
        name,
        args.workers,
        pod_spec=pod_spec,
        namespace=namespace,
        image=args.image,
        command=args.trainer_command,
        container=container,
        restart_mode=args.mode,
        max_restarts=args.max_restarts,
        spec=spec,
    )


def checkpoints_volume(where: str) -> JsonDict:
    """`--checkpoints`: `pvc:CLAIM` or a host path."""
    claim = where.removeprefix("pvc:")
    if claim != where:
        if not claim:
            raise UsageError("--checkpoints pvc:CLAIM: the claim's name is missing")
        return {"name": CHECKPOINTS_VOLUME, "persistentVolumeClaim": {"claimName": claim}}
    if not where.startswith("/"):
        raise UsageError(f"--checkpoints {where}: a host path is absolute (or pvc:CLAIM)")
    host_path = {"path": where, "type": "DirectoryOrCreate"}
    return {"name": CHECKPOINTS_VOLUME, "hostPath": host_path}


def program_configmap(job: str) -> str:
    return f"{job}-program"


def program_files(paths: Sequence[Path]) -> dict[str, str]:
    """`--program` files by name; raises UsageError naming one that cannot be read or clashes."""
    files: dict[str, str] = {}
    for path in paths:
        if path.name in files:
            raise UsageError(f"--program {path}: a second file named {path.name}")
        try:
            files[path.name] = path.read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"--program {path}: cannot read it as text ({e})") from e
    return files


async def submit(kube: Kube, args: argparse.Namespace, ns: str, out: TextIO) -> int:
    if args.program and args.filename is not None:
        raise UsageError("--program: not with -f (the manifest gives the job's volumes)")
    files = program_files(args.program)
    body = manifest_from_args(args, ns)
    job_ns = body["metadata"].get("namespace", ns)
    created = await kube.create(GANGJOBS, body, job_ns)
    name = created["metadata"]["name"]
    if files:
        # Owned by the job, so that deleting the job deletes it; the kubelet waits for it
        # before it starts a worker, so creating it second is safe.
        owner = {
            "apiVersion": created["apiVersion"],
            "kind": created["kind"],
            "name": name,
            "uid": created["metadata"]["uid"],
        }
        configmap = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": program_configmap(name), "ownerReferences": [owner]},
            "data": files,
        }
        await kube.create(CONFIGMAPS, configmap, job_ns)
    print(name, file=out)
    return 0


async def status(kube: Kube, args: argparse.Namespace, ns: str, out: TextIO) -> int:
    job = await kube.get(GANGJOBS, args.job, ns)
    for line in status_lines(job):
        print(line, file=out)
    return 0


async def restart(kube: Kube, args: argparse.Namespace, ns: str, out: TextIO) -> int:
    job = await kube.get(GANGJOBS, args.job, ns)
    st = job.get("status") or {}
    if st.get("phase") in TERMINAL:
        raise UsageError(f"{args.job}: the job has {st['phase'].lower()}; nothing to restart")
    epoch = int(st.get("epoch") or 0)
    patch = {"metadata": {"annotations": {ANNOTATION_RESTART: str(epoch)}}}
    await kube.patch(GANGJOBS, args.job, patch, ns)
    print(f"{args.job}: gang restart requested at epoch {epoch}", file=out)
    if args.wait:
        done = await _wait_job(
            kube, ns, args.job,
            lambda j: (j.get("status") or {}).get("barrierEpoch", -1) > epoch
            or (j.get("status") or {}).get("phase") in TERMINAL,
        )  # fmt: skip
        print(f"{args.job}: running at epoch {done['status'].get('barrierEpoch')}", file=out)
    return 0


async def delete(kube: Kube, args: argparse.Namespace, ns: str, out: TextIO) -> int:
    await kube.delete(GANGJOBS, args.job, ns, propagation_policy="Background")
    print(f"{args.job}: deleted", file=out)
    return 0


async def _wait_job(kube: Kube, ns: str, name: str, done: Callable[[JsonDict], bool]) -> JsonDict:
    while True:
        job = await kube.get(GANGJOBS, name, ns)
        if done(job):
            return job
        version = job["metadata"]["resourceVersion"]
        async with contextlib.aclosing(
            kube.watch(GANGJOBS, ns, field_selector=f"metadata.name={name}",
                       resource_version=version, timeout_seconds=60)
        ) as events:  # fmt: skip
            async for event in events:
                if event.type in ("ADDED", "MODIFIED") and done(event.object):
                    return event.object
                if event.type == "DELETED":
                    raise UsageError(f"{name}: deleted")


COMMANDS = {"submit": submit, "status": status, "logs": logs, "restart": restart, "delete": delete}


async def run(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    ns = args.namespace or context_namespace(args.kubeconfig, args.context)
    async with await Kube.from_kubeconfig(args.kubeconfig, context=args.context) as kube:
        return await COMMANDS[args.command](kube, args, ns, out)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return asyncio.run(run(args))
    except UsageError as e:
        print(f"gangjob {args.command}: {e}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # The reader went away (`gangjob logs ... | head`): nothing more to say, to anyone.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except NotFound as e:
        print(f"gangjob {args.command}: not found: {e}", file=sys.stderr)
        return EXIT_ERROR
    except (ApiError, OSError) as e:
        print(f"gangjob {args.command}: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
