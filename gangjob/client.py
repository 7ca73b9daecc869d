"""The GangJob client: submit a job (from an image and a command, from a Python function, or from
a manifest), get and list jobs, wait for one, stream a rank's log, restart the gang, delete it.

`Client` is for scripts and notebooks (plain calls; it runs its own event loop on a thread, so it
works inside Jupyter's running loop too); `AsyncClient` is the same API for asyncio code, and what
the `gangjob` command line is built on. Both talk to the cluster through `controller.k8s` with
the user's kubeconfig.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import itertools
import os
import sys
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from concurrent.futures import CancelledError
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TextIO, TypeVar

import yaml

from api.constants import ANNOTATION_RESTART
from controller.k8s import CONFIGMAPS, GANGJOBS, Conflict, JsonDict, Kube
from gangjob import spec as specmod
from gangjob.logs import stream_logs
from gangjob.model import TERMINAL, Job

T = TypeVar("T")


SCALE_ATTEMPTS = 5
"""Conditional patches of a job with roles that `scale` tries before giving up to conflicts."""


class JobError(RuntimeError):
    """The job cannot do what was asked (restart a finished job; it was deleted while waited
    for); the message says why."""


def context_namespace(kubeconfig: str | os.PathLike[str] | None, context: str | None) -> str:
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


class AsyncClient:
    """GangJobs in one namespace by default (`namespace`); each method takes another."""

    def __init__(self, kube: Kube, namespace: str = "default") -> None:
        self.kube = kube
        self.namespace = namespace

    @classmethod
    async def connect(
        cls,
        kubeconfig: str | os.PathLike[str] | None = None,
        *,
        context: str | None = None,
        namespace: str | None = None,
    ) -> Self:
        """With `kubeconfig` (default: $KUBECONFIG, then ~/.kube/config) and its `context`; the
        namespace defaults to the context's, else `default`."""
        kube = await Kube.from_kubeconfig(kubeconfig, context=context)
        return cls(kube, namespace or context_namespace(kubeconfig, context))

    async def close(self) -> None:
        await self.kube.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # --- submitting -----------------------------------------------------------------------

    async def submit(
        self,
        *,
        image: str,
        workers: int,
        command: Sequence[str] | None = None,
        func: Callable[..., Any] | None = None,
        func_kwargs: Mapping[str, Any] | None = None,
        name: str | None = None,
        namespace: str | None = None,
        processes: int | str | None = None,
        gpus: int = 0,
        env: Mapping[str, str] | None = None,
        mode: str | None = None,
        max_restarts: int | None = None,
        program: Sequence[Path | str] = (),
        checkpoints: str | None = None,
    ) -> Job:
        """Creates a GangJob of `workers` pods of `image` and returns it.

        Each worker runs `command` (it gets MASTER_ADDR, WORLD_SIZE, RANK and torchrun's PET_*
        variables), or `func(**func_kwargs)`: the function's source, shipped in the job's program
        ConfigMap and run with `python3 -u` (give `command` too, e.g. `["torchrun",
        "gangjob_main.py"]`, to launch it otherwise). `program` files go to the same ConfigMap,
        mounted at /program, the trainer's working directory. `checkpoints`: a directory every
        worker shares at /checkpoints, a host path or `pvc:CLAIM`."""
        files = specmod.read_program_files(program)
        if func is not None:
            if specmod.FUNCTION_FILE in files:
                raise specmod.SpecError("program", f"a file named {specmod.FUNCTION_FILE}")
            files[specmod.FUNCTION_FILE] = specmod.function_program(func, func_kwargs)
            command = command or ["python3", "-u", specmod.FUNCTION_FILE]
        elif func_kwargs:
            raise specmod.SpecError("func_kwargs", "only with func")
        ns = namespace or self.namespace
        name = name or specmod.random_name()
        body = specmod.manifest(
            name=name, namespace=ns, image=image, workers=workers, command=command or [],
            processes=processes, gpus=gpus, env=env, mode=mode, max_restarts=max_restarts,
            with_program=bool(files), checkpoints=checkpoints,
        )  # fmt: skip
        return await self.create(body, files=files)

    async def create(
        self,
        body: JsonDict,
        *,
        files: Mapping[str, str] | None = None,
        namespace: str | None = None,
    ) -> Job:
        """Creates the GangJob of a manifest (a dict, e.g. read from YAML) in its namespace, else
        `namespace`; `files` go to its program ConfigMap."""
        ns = body.get("metadata", {}).get("namespace") or namespace or self.namespace
        created = await self.kube.create(GANGJOBS, body, ns)
        if files:
            # Owned by the job, so that deleting the job deletes it; the kubelet waits for it
            # before it starts a worker, so creating it second is safe.
            configmap = specmod.program_configmap_body(created, files)
            await self.kube.create(CONFIGMAPS, configmap, ns)
        return Job.from_api(created)

    # --- reading --------------------------------------------------------------------------

    async def get(self, name: str, *, namespace: str | None = None) -> Job:
        return Job.from_api(await self.get_raw(name, namespace=namespace))

    async def get_raw(self, name: str, *, namespace: str | None = None) -> JsonDict:
        """The GangJob as the API returns it (camelCase dict)."""
        return await self.kube.get(GANGJOBS, name, namespace or self.namespace)

    async def list(
        self, *, namespace: str | None = None, all_namespaces: bool = False
    ) -> builtins.list[Job]:
        """Every GangJob of the namespace (or of all), by namespace and name."""
        found = await self.kube.list(
            GANGJOBS, None if all_namespaces else namespace or self.namespace
        )
        jobs = [Job.from_api(obj) for obj in found.items]
        return sorted(jobs, key=lambda j: (j.namespace, j.name))

    async def wait(
        self,
        name: str,
        *,
        until: Callable[[Job], bool] | None = None,
        timeout: float | None = None,
        namespace: str | None = None,
    ) -> Job:
        """Waits until `until(job)` holds (default: the job has finished) and returns the job;
        TimeoutError after `timeout` seconds, JobError if the job is deleted meanwhile."""
        done = until or (lambda job: job.finished)
        async with asyncio.timeout(timeout):
            return await self._watch_until(name, namespace or self.namespace, done)

    async def _watch_until(self, name: str, ns: str, done: Callable[[Job], bool]) -> Job:
        while True:
            raw = await self.kube.get(GANGJOBS, name, ns)
            job = Job.from_api(raw)
            if done(job):
                return job
            async with contextlib.aclosing(
                self.kube.watch(GANGJOBS, ns, field_selector=f"metadata.name={name}",
                                resource_version=raw["metadata"]["resourceVersion"],
                                timeout_seconds=60)
            ) as events:  # fmt: skip
                async for event in events:
                    if event.type == "DELETED":
                        raise JobError(f"{name}: deleted")
                    if event.type in ("ADDED", "MODIFIED"):
                        job = Job.from_api(event.object)
                        if done(job):
                            return job

    async def logs(
        self,
        name: str,
        *,
        rank: int = 0,
        follow: bool = False,
        out: TextIO | None = None,
        namespace: str | None = None,
    ) -> None:
        """Writes the trainer's log of the worker of `rank` to `out` (default: stdout); with
        `follow`, across the gang's in-place restarts until the job ends."""
        ns = namespace or self.namespace
        await stream_logs(self.kube, ns, name, rank, follow, out or sys.stdout)

    # --- acting ---------------------------------------------------------------------------

    async def restart(
        self, name: str, *, wait: bool = False, timeout: float | None = None,
        namespace: str | None = None,
    ) -> Job:  # fmt: skip
        """Asks the controller for one gang restart (annotates the job with its current epoch:
        asking twice at one epoch restarts once). With `wait`, returns once the barrier of the
        next epoch has opened (or the job has ended)."""
        ns = namespace or self.namespace
        job = await self.get(name, namespace=ns)
        if job.finished:
            raise JobError(f"{name}: the job has {job.phase.lower()}; nothing to restart")
        patch = {"metadata": {"annotations": {ANNOTATION_RESTART: str(job.epoch)}}}
        job = Job.from_api(await self.kube.patch(GANGJOBS, name, patch, ns))
        if not wait:
            return job
        epoch = job.epoch

        def restarted(j: Job) -> bool:
            barrier = j.resource.status.barrier_epoch
            return (barrier is not None and barrier > epoch) or j.finished

        return await self.wait(name, until=restarted, timeout=timeout, namespace=ns)

    async def scale(
        self, name: str, replicas: int, *, wait: bool = False, timeout: float | None = None,
        namespace: str | None = None,
    ) -> Job:  # fmt: skip
        """Resizes an elastic GangJob: sets `spec.replicas` (`spec.elastic`), or its elastic
        role's `replicas` (`spec.roles[].elastic`, the last role), which the gang takes at its
        next epoch, in place. Raises JobError for a job that is not elastic, has finished, or a
        size outside its bounds (the apiserver's refusal names the field). With `wait`,
        returns once the gang runs at the new size (or the job has ended)."""
        ns = namespace or self.namespace
        for attempt in itertools.count(1):
            raw = await self.get_raw(name, namespace=ns)
            job = Job.from_api(raw)
            if job.finished:
                raise JobError(f"{name}: the job has {job.phase.lower()}; nothing to scale")
            spec = job.resource.spec
            elastic = spec.elasticity
            if elastic is None:
                raise JobError(
                    f"{name}: neither spec.elastic nor spec.roles[].elastic is set: its "
                    "replicas are immutable"
                )
            bounds = elastic.bounds
            if not bounds.admits(replicas):
                raise JobError(
                    f"--replicas {replicas}: must be within {elastic.field}.minReplicas.."
                    f"maxReplicas ({bounds.min_replicas}..{bounds.max_replicas})"
                )
            patch: JsonDict = {"spec": {"replicas": replicas}}
            if spec.roles is not None:
                # A merge patch replaces a list whole: the roles as read, the last one
                # resized, and only if nobody changed the job since (the resourceVersion;
                # the controller's status writes move it too: read again and retry).
                roles = [dict(role) for role in raw["spec"]["roles"]]
                roles[-1]["replicas"] = replicas
                version = raw["metadata"]["resourceVersion"]
                patch = {"metadata": {"resourceVersion": version}, "spec": {"roles": roles}}
            world = elastic.first + replicas
            try:
                job = Job.from_api(await self.kube.patch(GANGJOBS, name, patch, ns))
                break
            except Conflict:
                if attempt >= SCALE_ATTEMPTS:
                    raise
        if not wait:
            return job

        def resized(j: Job) -> bool:
            status = j.resource.status
            return j.finished or (
                status.world_size == world and status.barrier_epoch == status.epoch
            )

        return await self.wait(name, until=resized, timeout=timeout, namespace=ns)

    async def delete(self, name: str, *, namespace: str | None = None) -> None:
        """Deletes the GangJob; its pods, Service and program ConfigMap go with it."""
        await self.kube.delete(
            GANGJOBS, name, namespace or self.namespace, propagation_policy="Background"
        )


class Client:
    """`AsyncClient` as plain calls, for scripts and notebooks. Use `with`, or `close()`.

    from gangjob import Client
    with Client() as client:
        job = client.submit(image="my/trainer:1", workers=2, command=["torchrun", "train.py"])
        print(client.wait(job.name).phase)
    """

    def __init__(
        self,
        kubeconfig: str | os.PathLike[str] | None = None,
        *,
        context: str | None = None,
        namespace: str | None = None,
    ) -> None:
        # A loop of its own, on a thread: Jupyter's cells already run inside a loop, where
        # asyncio.run cannot; and the client's connections belong to the loop that made them.
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="gangjob-client", daemon=True
        )
        self._thread.start()
        try:
            self.aio = self._run(
                AsyncClient.connect(kubeconfig, context=context, namespace=namespace)
            )
        except BaseException:
            self._stop()
            raise

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result()
        except (KeyboardInterrupt, CancelledError):
            future.cancel()
            raise

    def _stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    @property
    def namespace(self) -> str:
        return self.aio.namespace

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._run(self.aio.close())
        self._stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def submit(self, **kwargs: Any) -> Job:
        """`AsyncClient.submit`: image, workers, command or func, and the rest by keyword."""
        return self._run(self.aio.submit(**kwargs))

    def create(self, body: JsonDict, **kwargs: Any) -> Job:
        return self._run(self.aio.create(body, **kwargs))

    def get(self, name: str, *, namespace: str | None = None) -> Job:
        return self._run(self.aio.get(name, namespace=namespace))

    def list(
        self, *, namespace: str | None = None, all_namespaces: bool = False
    ) -> builtins.list[Job]:
        return self._run(self.aio.list(namespace=namespace, all_namespaces=all_namespaces))

    def wait(
        self,
        name: str,
        *,
        until: Callable[[Job], bool] | None = None,
        timeout: float | None = None,
        namespace: str | None = None,
    ) -> Job:
        return self._run(self.aio.wait(name, until=until, timeout=timeout, namespace=namespace))

    def logs(
        self,
        name: str,
        *,
        rank: int = 0,
        follow: bool = False,
        out: TextIO | None = None,
        namespace: str | None = None,
    ) -> None:
        self._run(
            self.aio.logs(
                name, rank=rank, follow=follow, out=out or sys.stdout, namespace=namespace
            )
        )

    def restart(
        self, name: str, *, wait: bool = False, timeout: float | None = None,
        namespace: str | None = None,
    ) -> Job:  # fmt: skip
        return self._run(self.aio.restart(name, wait=wait, timeout=timeout, namespace=namespace))

    def scale(
        self, name: str, replicas: int, *, wait: bool = False, timeout: float | None = None,
        namespace: str | None = None,
    ) -> Job:  # fmt: skip
        return self._run(
            self.aio.scale(name, replicas, wait=wait, timeout=timeout, namespace=namespace)
        )

    def delete(self, name: str, *, namespace: str | None = None) -> None:
        self._run(self.aio.delete(name, namespace=namespace))


__all__ = ["TERMINAL", "AsyncClient", "Client", "Job", "JobError", "context_namespace"]
