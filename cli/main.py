"""`gangjob` (also `kubectl gangjob`): submit a GangJob, follow it, restart it, delete it, with
your kubeconfig.

    gangjob submit --image IMG --workers 2 --processes 2 -- torchrun train.py
    gangjob list -A
    gangjob status JOB
    gangjob logs JOB --rank 1 -f
    gangjob restart JOB
    gangjob report JOB -o job.png
    gangjob delete JOB
    source <(gangjob completion bash)

A thin layer over the Python client (`gangjob.AsyncClient`): flags in, the client's calls, text
out.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import yaml

from api.constants import ANNOTATION_RESTART, NPROC_AUTO
from api.v1alpha1 import RestartMode
from cli import completion
from cli.render import list_lines, status_lines
from cli.timeline import ReportError
from controller.k8s import ApiError, JsonDict, NotFound
from gangjob import spec as specmod
from gangjob.client import AsyncClient, JobError, context_namespace
from gangjob.model import Job
from gangjob.spec import CHECKPOINTS_DIR, PROGRAM_DIR, SpecError

EXIT_ERROR = 1
EXIT_USAGE = 2
__all__ = ["UsageError", "context_namespace", "main", "manifest_from_args", "parser"]


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


def parser(prog: str = "gangjob") -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)"
    )
    common.add_argument("--context", help="kubeconfig context (default: the current one)")
    common.add_argument(
        "-n", "--namespace", help="namespace (default: the context's, else `default`)"
    )

    p = argparse.ArgumentParser(
        prog=prog,
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

    listing = sub.add_parser(
        "list",
        parents=[common],
        help="every GangJob of the namespace (or all): phase, workers, epoch, restarts, step, "
        "goodput",
        description="One line per GangJob, as `kubectl get` prints them: phase, workers ready, "
        "epoch, gang restarts, and the training step and goodput of jobs whose trainers report "
        "progress (`-` otherwise).",
    )
    listing.add_argument(
        "-A", "--all-namespaces", action="store_true", help="the jobs of every namespace"
    )
    listing.add_argument(
        "-o", "--output", choices=["wide", "name"], default="wide",
        help="`name`: only resource/name, one a line (default: the table)",
    )  # fmt: skip

    report = sub.add_parser(
        "report",
        parents=[common],
        help="the job's timeline as a picture (PNG or SVG): step over time, restarts, lost work",
        description="Write a picture of the job's history: its training step over time (the "
        "epochs, for a job without progress reports), each restart marked with its class and "
        "duration, the work lost to it shaded. Needs matplotlib (`pip install "
        "'gangjob[report]'`).",
    )
    report.add_argument("job", help="the GangJob's name")
    report.add_argument(
        "-o", "--output", type=Path,
        help="the file to write, .png or .svg (default: JOB-timeline.png here)",
    )  # fmt: skip

    comp = sub.add_parser(
        "completion",
        help="print the shell completion script (bash, zsh or fish)",
        description="Print a script that completes gangjob's commands, flags and job names. "
        "bash: `source <(gangjob completion bash)`; zsh: `source <(gangjob completion zsh)`; "
        "fish: `gangjob completion fish | source`. `kubectl gangjob` completes through the "
        "`kubectl_complete-gangjob` script installed beside it.",
    )
    comp.add_argument("shell", choices=sorted(completion.SCRIPTS), help="the shell")

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

    scale = sub.add_parser(
        "scale",
        parents=[common],
        help="resize an elastic gang in place",
        description="Set an elastic GangJob's spec.replicas (within spec.elastic.minReplicas.."
        "maxReplicas), or its elastic role's (spec.roles[].elastic, the last role, within its "
        "bounds): at its next epoch the gang restarts in place at the new size, surplus "
        "workers (the highest ranks) deleted, new ones created, every kept worker given the new "
        "WORLD_SIZE.",
    )
    scale.add_argument("job", help="the GangJob's name")
    scale.add_argument(
        "--replicas", type=int, required=True, help="the new gang size (or elastic role size)"
    )
    scale.add_argument(
        "--wait", action="store_true", help="wait until the gang runs at the new size"
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


def manifest_from_args(args: argparse.Namespace, namespace: str) -> JsonDict:
    """The GangJob of `submit`'s flags (`gangjob.spec.manifest`); or the one of `-f`."""
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
    try:
        return specmod.manifest(
            name=args.name or specmod.random_name(), namespace=namespace, image=args.image,
            workers=args.workers, command=args.trainer_command, processes=args.processes,
            gpus=args.gpus, env=dict(args.env), mode=args.mode, max_restarts=args.max_restarts,
            with_program=bool(args.program), checkpoints=args.checkpoints,
        )  # fmt: skip
    except SpecError as e:
        raise UsageError(_flag_error(e)) from e


def _flag_error(e: SpecError) -> str:
    flag = "COMMAND" if e.field == "command" else f"--{e.field.replace('_', '-')}"
    rule = "give the trainer's command after `--`" if e.field == "command" else e.rule
    return f"{flag}{'' if e.value is None else f' {e.value}'}: {rule}"


async def submit(client: AsyncClient, args: argparse.Namespace, out: TextIO) -> int:
    if args.program and args.filename is not None:
        raise UsageError("--program: not with -f (the manifest gives the job's volumes)")
    try:
        files = specmod.read_program_files(args.program)
    except SpecError as e:
        raise UsageError(_flag_error(e)) from e
    job = await client.create(manifest_from_args(args, client.namespace), files=files)
    print(job.name, file=out)
    return 0


async def status(client: AsyncClient, args: argparse.Namespace, out: TextIO) -> int:
    for line in status_lines(await client.get_raw(args.job)):
        print(line, file=out)
    return 0


async def list_jobs(client: AsyncClient, args: argparse.Namespace, out: TextIO) -> int:
    jobs = await client.list(all_namespaces=args.all_namespaces)
    if args.output == "name":
        for job in jobs:
            print(f"gangjob.gangjob.io/{job.name}", file=out)
        return 0
    if not jobs:
        where = "any namespace" if args.all_namespaces else f"{client.namespace} namespace"
        print(f"No GangJobs found in {where}.", file=sys.stderr)
        return 0
    for line in list_lines(jobs, all_namespaces=args.all_namespaces):
        print(line, file=out)
    return 0


async def logs(client: AsyncClient, args: argparse.Namespace, out: TextIO) -> int:
    await client.logs(args.job, rank=args.rank, follow=args.follow, out=out)
    return 0


async def restart(client: AsyncClient, args: argparse.Namespace, out: TextIO) -> int:
    job = await client.get(args.job)
    if job.finished:
        raise UsageError(f"{args.job}: the job has {job.phase.lower()}; nothing to restart")
    asked = await client.restart(args.job)
    print(f"{args.job}: gang restart requested at epoch {asked.epoch}", file=out)
    if args.wait:
        epoch = asked.epoch

        def restarted(j: Job) -> bool:
            barrier = j.resource.status.barrier_epoch
            return (barrier is not None and barrier > epoch) or j.finished

        done = await client.wait(args.job, until=restarted)
        print(f"{args.job}: running at epoch {done.resource.status.barrier_epoch}", file=out)
    return 0


async def scale(client: AsyncClient, args: argparse.Namespace, out: TextIO) -> int:
    job = await client.scale(args.job, args.replicas)
    print(f"{args.job}: replicas set to {args.replicas}", file=out)
    if args.wait:
        job = await client.scale(args.job, args.replicas, wait=True)
        status = job.resource.status
        print(f"{args.job}: running {status.world_size} workers at epoch {status.epoch}", file=out)
    return 0


async def delete(client: AsyncClient, args: argparse.Namespace, out: TextIO) -> int:
    await client.delete(args.job)
    print(f"{args.job}: deleted", file=out)
    return 0


COMMANDS = {
    "submit": submit,
    "status": status,
    "list": list_jobs,
    "logs": logs,
    "restart": restart,
    "scale": scale,
    "delete": delete,
}


async def run(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    if args.command == "report":
        from cli.report import report  # matplotlib, an extra: imported only when asked for

        command = report
    else:
        command = COMMANDS[args.command]
    client = await AsyncClient.connect(
        args.kubeconfig, context=args.context, namespace=args.namespace
    )
    async with client:
        return await command(client, args, out)


def program_name() -> str:
    """`kubectl gangjob` when kubectl runs this as its plugin `kubectl-gangjob`."""
    name = Path(sys.argv[0]).name
    return "kubectl gangjob" if name.startswith("kubectl-") else "gangjob"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [completion.COMPLETE]:
        for word in completion.candidates(parser(), argv[1:]):
            print(word)
        return 0
    p = parser(program_name())
    args = p.parse_args(argv)
    if args.command == "completion":
        print(completion.SCRIPTS[args.shell](), end="")
        return 0
    try:
        return asyncio.run(run(args))
    except (UsageError, SpecError, JobError) as e:
        print(f"gangjob {args.command}: {e}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # The reader went away (`gangjob logs ... | head`): nothing more to say, to anyone.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except NotFound as e:
        print(f"gangjob {args.command}: not found: {e}", file=sys.stderr)
        return EXIT_ERROR
    except (ApiError, OSError, TimeoutError) as e:
        print(f"gangjob {args.command}: {e}", file=sys.stderr)
        return EXIT_ERROR
    except ReportError as e:
        print(f"gangjob {args.command}: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
