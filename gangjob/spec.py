"""What a GangJob to submit is made of: the manifest of `Client.submit`'s arguments (built by
`api.builders.gangjob`, the one builder, so that a job submitted here is one a user would write),
and the program files of a Python function. Pure: no cluster."""

from __future__ import annotations

import inspect
import secrets
import string
import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from api import builders
from api.constants import NPROC_AUTO
from api.v1alpha1 import RestartMode

PROGRAM_DIR = "/program"
PROGRAM_VOLUME = "program"
CHECKPOINTS_DIR = "/checkpoints"
CHECKPOINTS_VOLUME = "checkpoints"
FUNCTION_FILE = "gangjob_main.py"
"""The file a submitted function is written to, in the program directory."""

JsonDict = dict[str, Any]


class SpecError(ValueError):
    """A job that cannot be submitted. `field` names the argument (`image`, `workers`...), and
    the message says the rule."""

    def __init__(self, field: str, rule: str, value: str | None = None) -> None:
        super().__init__(f"{field}{'' if value is None else f' {value}'}: {rule}")
        self.field = field
        self.rule = rule
        self.value = value


def random_name() -> str:
    suffix = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(5))
    return f"train-{suffix}"


def program_configmap(job: str) -> str:
    """The ConfigMap holding a job's program files (owned by the job)."""
    return f"{job}-program"


def function_program(func: Callable[..., Any], kwargs: Mapping[str, Any] | None = None) -> str:
    """A script that defines `func` (its source) and calls it with `kwargs`: what a worker runs
    for `Client.submit(func=...)`. The function must import what it uses inside its body, as a
    function shipped to another process does (Kubeflow Trainer's rule too)."""
    if not inspect.isfunction(func) or func.__name__ == "<lambda>":
        raise SpecError("func", "a function defined with `def` (its source is shipped)")
    try:
        source = textwrap.dedent(inspect.getsource(func))
    except (OSError, TypeError) as e:
        raise SpecError("func", f"its source cannot be read ({e})") from e
    call = f"{func.__name__}(**{dict(kwargs or {})!r})"
    return f"{source}\n\nif __name__ == '__main__':\n    {call}\n"


def read_program_files(paths: Sequence[Path | str]) -> dict[str, str]:
    """Program files by name; raises SpecError naming one that cannot be read or clashes."""
    files: dict[str, str] = {}
    for path in map(Path, paths):
        if path.name in files:
            raise SpecError("program", f"a second file named {path.name}", str(path))
        try:
            files[path.name] = path.read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise SpecError("program", f"cannot read it as text ({e})", str(path)) from e
    return files


def checkpoints_volume(where: str) -> JsonDict:
    """`checkpoints`: `pvc:CLAIM` or an absolute host path."""
    claim = where.removeprefix("pvc:")
    if claim != where:
        if not claim:
            raise SpecError("checkpoints", "the claim's name is missing", where)
        return {"name": CHECKPOINTS_VOLUME, "persistentVolumeClaim": {"claimName": claim}}
    if not where.startswith("/"):
        raise SpecError("checkpoints", "a host path is absolute (or pvc:CLAIM)", where)
    host_path = {"path": where, "type": "DirectoryOrCreate"}
    return {"name": CHECKPOINTS_VOLUME, "hostPath": host_path}


def manifest(
    *,
    name: str,
    namespace: str,
    image: str | None,
    workers: int | None,
    command: Sequence[str],
    processes: int | str | None = None,
    gpus: int = 0,
    env: Mapping[str, str] | None = None,
    mode: str | None = None,
    max_restarts: int | None = None,
    with_program: bool = False,
    checkpoints: str | None = None,
) -> JsonDict:
    """The GangJob of `workers` pods running `command` in `image`; `with_program` mounts the
    ConfigMap `program_configmap(name)` at PROGRAM_DIR, the trainer's working directory."""
    if not image:
        raise SpecError("image", "required")
    if not workers or workers < 1:
        raise SpecError("workers", "required, an integer >= 1")
    if not command:
        raise SpecError("command", "the trainer's command is required")
    if (
        processes is not None
        and processes != NPROC_AUTO
        and (not isinstance(processes, int) or processes < 1)
    ):
        raise SpecError("processes", f"an integer >= 1 or {NPROC_AUTO!r}")
    if mode is not None and mode not in {m.value for m in RestartMode}:
        raise SpecError("mode", f"one of {', '.join(m.value for m in RestartMode)}")
    container: JsonDict = {}
    if env:
        container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    if gpus:
        limits = {"nvidia.com/gpu": str(gpus)}
        container["resources"] = {"limits": limits, "requests": dict(limits)}
    pod_spec: JsonDict = {}
    if with_program:
        container["workingDir"] = PROGRAM_DIR
        mount = {"name": PROGRAM_VOLUME, "mountPath": PROGRAM_DIR, "readOnly": True}
        container["volumeMounts"] = [mount]
        volume = {"name": PROGRAM_VOLUME, "configMap": {"name": program_configmap(name)}}
        pod_spec["volumes"] = [volume]
    if checkpoints:
        mount = {"name": CHECKPOINTS_VOLUME, "mountPath": CHECKPOINTS_DIR}
        container["volumeMounts"] = [*container.get("volumeMounts", []), mount]
        pod_spec["volumes"] = [*pod_spec.get("volumes", []), checkpoints_volume(checkpoints)]
    spec: JsonDict = {}
    if processes is not None:
        spec["nprocPerNode"] = processes
    return builders.gangjob(
        name,
        workers,
        pod_spec=pod_spec,
        namespace=namespace,
        image=image,
        command=list(command),
        container=container,
        restart_mode=mode,
        max_restarts=max_restarts,
        spec=spec,
    )


def program_configmap_body(job: JsonDict, files: Mapping[str, str]) -> JsonDict:
    """The program ConfigMap of the created `job`, owned by it so that it goes with the job."""
    owner = {
        "apiVersion": job["apiVersion"],
        "kind": job["kind"],
        "name": job["metadata"]["name"],
        "uid": job["metadata"]["uid"],
    }
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": program_configmap(job["metadata"]["name"]),
            "ownerReferences": [owner],
        },
        "data": dict(files),
    }
