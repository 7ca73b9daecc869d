"""What a campaign runs in: the sim cluster, a namespace with its KWOK nodes, two controller
replicas electing a leader (restarted when they exit, as a Deployment's kubelet would), the
arrival proxy in front of the leader, the simulated kubelet with the real agents, the gangs,
and the observer. Also the few questions the injectors ask of it (a gang's workers, whether
a gang runs at an open barrier, which replica leads)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from agent.agent import Step
from agent.apiclient import HttpClient, ssl_context
from api import builders
from api.constants import LABEL_NAME, LABEL_RANK, AgentPlacement
from benchmarks.faults.observer import Checker, Observer
from benchmarks.faults.proxy import ArrivalProxy
from controller.k8s import GANGJOBS, LEASES, NAMESPACES, NODES, PODS, JsonDict, Kube, NotFound
from localcluster.cluster import SIMULATED_KUBELET_LABEL, Cluster, Options, kwok_node
from localcluster.simkubelet import SimKubelet, SimProgress
from localcluster.tools import SYSTEM_NS, ControllerProcess, controller_kubeconfig, install_crd

NODE_LABEL = "gangjob-faults"
PODS_PER_NODE = 6
FATAL_CODE = 3
"""The exit code every campaign gang's failure policy sends to `FailJob`."""
FORCE_DELETE_AFTER = 2
"""`spec.nodeLoss.forceDeleteAfterSeconds` of the campaign's gangs."""
HANG_SECONDS = 10
"""`spec.progress.hangSeconds` of the campaign's gangs: small, so that a hang costs a fault
little more than a crash; well above the stand-in trainers' step (`PROGRESS`)."""
PROGRESS = SimProgress(steps_per_second=2.0, checkpoint_every=20, compute_seconds=0.3, jitter=0.1)
"""How the campaign's stand-in trainers (`Process` mode) report their steps and compute."""
STRAGGLER = {"ratio": 1.5, "forSeconds": 10}
"""`spec.progress.straggler` of the campaign's gangs (only `Process` gangs report compute)."""
MOVE_STRAGGLERS = {"action": "RecreateWorker", "onFailureClasses": ["Straggler"]}
"""The rule of the gangs that move a straggler off its node; the others only report it."""


@dataclass(frozen=True)
class Shape:
    """A gang the campaign keeps running: its base name, restart mode and size, and whether
    its failure policy moves a straggler (`MOVE_STRAGGLERS`) or only reports it."""

    name: str
    mode: str
    replicas: int
    move_stragglers: bool = False


@dataclass
class Gang:
    shape: Shape
    name: str
    generation: int = 0


@dataclass
class World:
    cluster: Cluster
    kube: Kube
    ns: str
    api: HttpClient
    proxy: ArrivalProxy
    replicas: list[ControllerProcess]
    sim: SimKubelet
    observer: Observer
    checker: Checker
    gangs: dict[str, Gang] = field(default_factory=dict)
    nodes: list[str] = field(default_factory=list)
    held: set[int] = field(default_factory=set)
    """Replicas (by index) the supervisor must not restart (a failover in progress)."""
    control_plane: dict[str, list[str]] = field(default_factory=dict)
    """Each cluster process's command line at the start, to start it again if it exits."""
    control_plane_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held while a fault or the supervisor restarts a control-plane process."""
    revived: list[str] = field(default_factory=list)
    """Control-plane processes that exited on their own and were started again."""
    leader_port: int | None = None
    leader_index: int | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    # -- the gangs ------------------------------------------------------------------------
    def manifest(self, gang: Gang) -> JsonDict:
        return builders.gangjob(
            gang.name,
            gang.shape.replicas,
            namespace=self.ns,
            image="localhost/busybox:dev",
            command=["sh", "-c", "sleep infinity"],
            container={"resources": {"limits": {"nvidia.com/gpu": "1"}}},
            pod_spec={"nodeSelector": {NODE_LABEL: self.ns}},
            pod_labels={SIMULATED_KUBELET_LABEL: "true"},
            restart_mode=gang.shape.mode,
            max_restarts=1000,
            failure_rules=[
                {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [FATAL_CODE]}},
                *([MOVE_STRAGGLERS] if gang.shape.move_stragglers else []),
            ],
            spec={
                "nodeLoss": {"forceDeleteAfterSeconds": FORCE_DELETE_AFTER},
                "progress": {"hangSeconds": HANG_SECONDS, "straggler": STRAGGLER},
            },
        )

    async def create_gang(self, shape: Shape, generation: int = 0) -> Gang:
        name = shape.name if generation == 0 else f"{shape.name}-g{generation}"
        gang = Gang(shape, name, generation)
        await self.kube.create(GANGJOBS, self.manifest(gang), self.ns)
        self.gangs[shape.name] = gang
        return gang

    async def replace_gang(self, gang: Gang) -> Gang:
        """The gang deleted (the campaign's doing) and a new one of its shape created."""
        self.checker.expect_deleted(gang.name)
        with contextlib.suppress(NotFound):
            await self.kube.delete(GANGJOBS, gang.name, self.ns, propagation_policy="Background")
        return await self.create_gang(gang.shape, gang.generation + 1)

    def workers(self, job: str) -> dict[int, str]:
        """The gang's pods the simulation knows, by rank (not terminating)."""
        out: dict[int, str] = {}
        for name, pod in self.sim.pods.items():
            labels = pod["metadata"].get("labels") or {}
            if labels.get(LABEL_NAME) == job and not pod["metadata"].get("deletionTimestamp"):
                out[int(labels.get(LABEL_RANK, -1))] = name
        return out

    def agents_open(self, job: str, epoch: int) -> int:
        """Workers of `job` whose agent runs past the barrier of `epoch` (`Process` mode: and
        whose trainer runs)."""
        count = 0
        for rank, name in self.workers(job).items():
            w = self.sim.workers.get(name)
            if w is None or w.agent is None or rank < 0:
                continue
            st = w.agent.state
            if st.epoch != epoch or st.step is not Step.RUNNING or not st.barrier_open:
                continue
            if w.mode is AgentPlacement.WRAPPER and (w.trainer is None or not w.trainer.running):
                continue
            count += 1
        return count

    def steady(self, job: str) -> bool:
        """Running at an open barrier, every worker past it."""
        gang = next((g for g in self.gangs.values() if g.name == job), None)
        facts = self.observer.facts(job)
        if gang is None or not facts.open:
            return False
        return self.agents_open(job, facts.epoch) == gang.shape.replicas

    def summarised(self, job: str) -> bool:
        """Every worker's agent has sent a summary of its trainer's compute at the gang's
        epoch: from then on a shift of a worker's compute is told at once."""
        facts = self.observer.facts(job)
        workers = self.workers(job)
        for name in workers.values():
            w = self.sim.workers.get(name)
            monitor = w.agent.progress if w is not None and w.agent is not None else None
            if monitor is None or w is None or w.agent is None:
                return False
            if w.agent.state.epoch != facts.epoch or monitor.tracker.sent_compute is None:
                return False
        return bool(workers)

    def failed(self, job: str) -> bool:
        return self.observer.facts(job).phase == "Failed"

    # -- nodes ----------------------------------------------------------------------------
    async def add_node(self) -> str:
        name = f"{self.ns[-10:]}-n{len(self.nodes)}"
        node = kwok_node(name, Options(pods_per_node=PODS_PER_NODE, gpus_per_node=PODS_PER_NODE))
        node["metadata"]["labels"][NODE_LABEL] = self.ns
        await self.kube.create(NODES, node)
        self.nodes.append(name)
        return name

    def node_of(self, pod_name: str) -> str:
        return str(self.sim.pods[pod_name]["spec"].get("nodeName", ""))

    # -- the controller replicas ------------------------------------------------------------
    def leader(self) -> ControllerProcess | None:
        return None if self.leader_index is None else self.replicas[self.leader_index]

    async def _follow_leader(self) -> None:
        """Which replica holds the Lease (its identity ends `_<pid>_<time>`), for the proxy."""
        while True:
            try:
                lease = await self.kube.get(LEASES, lease_id(self.ns), SYSTEM_NS)
                holder = str(lease.get("spec", {}).get("holderIdentity") or "")
                parts = holder.split("_")
                pid = int(parts[-2]) if len(parts) >= 3 and parts[-2].isdigit() else -1
                self.leader_index = next(
                    (i for i, r in enumerate(self.replicas) if r.proc and r.proc.pid == pid), None
                )
                r = self.leader()
                self.leader_port = r.arrival_port if r is not None and r.alive() else None
            except NotFound:
                self.leader_index = self.leader_port = None
            except Exception:  # the apiserver down for a fault: ask again
                pass
            await asyncio.sleep(0.3)  # a Lease is renewed every 2 s; nothing to watch cheaper

    async def _supervise(self) -> None:
        """A replica that exited (killed, or it lost the Lease) starts again after 1 s, as its
        pod's container would."""
        while True:
            for i, r in enumerate(self.replicas):
                if i not in self.held and not r.alive():
                    await asyncio.sleep(1.0)
                    if i not in self.held and not r.alive():
                        print(
                            f"  controller replica {i} exited ({_code(r)}); starting it again",
                            file=sys.stderr,
                        )
                        r.start()
            await asyncio.sleep(0.2)

    async def restart_component(
        self, component: str, cmd: list[str] | None = None, down_seconds: float = 0.0
    ) -> list[str]:
        """`Cluster.restart_component` for a fault, the supervisor kept out meanwhile."""
        async with self.control_plane_lock:
            return await asyncio.to_thread(
                self.cluster.restart_component, component, cmd, down_seconds
            )

    async def _supervise_control_plane(self) -> None:
        """A control-plane process that exited is started again 1 s later, as the kubelet
        restarts a static pod (kube-scheduler exits when its cache is found inconsistent)."""
        while True:
            await asyncio.sleep(1.0)
            async with self.control_plane_lock:
                for proc in self.cluster.procs():
                    if proc.alive() or proc.name not in self.control_plane:
                        continue
                    print(f"  {proc.name} exited; starting it again (see {proc.log})",
                          file=sys.stderr)  # fmt: skip
                    self.revived.append(proc.name)
                    await asyncio.to_thread(
                        self.cluster.restart_component, proc.name, self.control_plane[proc.name]
                    )

    async def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        for t in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        await self.observer.close()
        for r in self.replicas:
            r.stop()
        await self.sim.close()
        await self.proxy.close()
        await self.api.close()
        for node in self.nodes:
            with contextlib.suppress(NotFound):
                await self.kube.delete(NODES, node)
        for pod in (await self.kube.list(PODS, self.ns)).items:
            with contextlib.suppress(NotFound):
                await self.kube.delete(
                    PODS, pod["metadata"]["name"], self.ns, grace_period_seconds=0
                )
        with contextlib.suppress(NotFound):
            await self.kube.delete(NAMESPACES, self.ns)


def lease_id(ns: str) -> str:
    """The campaign's own Lease, where the controller's RBAC lets it hold one."""
    return f"gangjob-{ns}"


def _code(r: ControllerProcess) -> str:
    return f"exit {r.proc.returncode}" if r.proc is not None else "never started"


def ensure_cluster(name: str) -> tuple[Cluster, bool]:
    """The sim cluster up; whether this run started it."""
    cluster = Cluster(name)
    if cluster.is_up():
        return cluster, False
    cluster.up(Options(profile="sim", nodes=1), sys.stderr)
    return cluster, True


async def open_world(
    cluster: Cluster,
    kube: Kube,
    observer_kube: Kube,
    checker: Checker,
    shapes: list[Shape],
    nodes: int,
    restart_delay: float,
    logs: Path,
    lease_duration: float = 15.0,
) -> World:
    """Everything up, the gangs created (not yet waited for)."""
    install_crd(cluster)
    ctl_kubeconfig = controller_kubeconfig(cluster)
    ns = f"faults-{uuid.uuid4().hex[:6]}"
    await kube.create(NAMESPACES, {"metadata": {"name": ns}})
    api = HttpClient(
        cluster.server,
        ssl_context=ssl_context(
            cluster.pki / "ca.crt", cluster.pki / "admin.crt", cluster.pki / "admin.key"
        ),
    )
    replicas = [
        ControllerProcess(
            ctl_kubeconfig,
            [
                f"--namespace={ns}",
                "--leader-elect",
                f"--leader-election-namespace={SYSTEM_NS}",
                f"--leader-election-id={lease_id(ns)}",
                f"--leader-elect-lease-duration={lease_duration:g}s",
                f"--leader-elect-renew-deadline={lease_duration * 2 / 3:g}s",
                f"--leader-elect-retry-period={min(2.0, lease_duration / 6):g}s",
                "--log-level=info",
            ],
            logs / f"controller-{i}.log",
            arrivals=True,
        )
        for i in range(2)
    ]
    holder: dict[str, World] = {}

    def target() -> int | None:
        return holder["w"].leader_port if "w" in holder else None

    proxy = ArrivalProxy(target)
    await proxy.start()
    sim = SimKubelet(
        api,
        ns,
        restart_delay=restart_delay,
        start_delay=0.3,
        arrival_url=proxy.url,
        kill_grace_seconds=0.5,
        progress=PROGRESS,
    )
    observer = Observer(observer_kube, ns, sim, checker)
    w = World(cluster, kube, ns, api, proxy, replicas, sim, observer, checker)
    w.control_plane = {p.name: cluster.command_of(p.name) for p in cluster.procs()}
    holder["w"] = w
    for _ in range(nodes):
        await w.add_node()
    for r in replicas:
        r.start()
    w.tasks = [
        asyncio.create_task(sim.run()),
        asyncio.create_task(w._follow_leader()),
        asyncio.create_task(w._supervise()),
        asyncio.create_task(w._supervise_control_plane()),
    ]
    observer.start()
    for shape in shapes:
        await w.create_gang(shape)
    return w


async def wait(cond: Callable[[], bool], timeout: float) -> bool:
    """Polls `cond` (the simulation's agents have no event of their own to wait on) until it
    holds or `timeout` passes; whether it held."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True
