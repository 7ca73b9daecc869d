"""The world a scale run measures in: the local cluster (started with the scheduler QPS and
endpoint batching asked for), the KWOK nodes of one gang size, the gangs themselves (created,
brought to a steady epoch, torn down), and the node failure that node-lost injects."""

from __future__ import annotations

import asyncio
import math
import sys
import time
from dataclasses import dataclass, field

from agent.apiclient import ApiError, ClientError, HttpClient
from api import builders
from api.constants import LABEL_NAME
from benchmarks.common import Progress, rss_mib
from benchmarks.scale.observer import JobTracker, agents_at, milestones, pods_where, polled, running
from benchmarks.scale.settings import (
    BENCH_LABEL,
    BULK_TAINT,
    PODS_PER_NODE,
    VICTIMS_LABEL,
    Settings,
)
from controller.k8s import GANGJOBS, NODES, JsonDict, Kube, NotFound
from controller.k8s.errors import ApiError as KubeError
from localcluster.cluster import (
    KWOK_NODE_ANNOTATION,
    KWOK_STATUS_ANNOTATION,
    SIMULATED_KUBELET_LABEL,
    Cluster,
    Options,
    kwok_node,
)
from localcluster.outofcluster import AddonProcess
from localcluster.simkubelet import SimKubelet
from localcluster.tools import ControllerProcess


@dataclass
class World:
    """What one size's measurements share."""

    n: int
    settings: Settings
    cluster: Cluster
    kube: Kube
    api: HttpClient
    ctl: ControllerProcess
    ns: str = ""
    sim: SimKubelet | None = None
    nodes: list[str] = field(default_factory=list)
    victims: list[str] = field(default_factory=list)
    bulk: list[str] = field(default_factory=list)
    """The nodes of `PODS_PER_NODE` pods (the rest hold one each)."""
    gang_victims: list[str] = field(default_factory=list)
    gang_victims_of: str = ""
    """The gang whose `gang_victims` they are."""
    """Single-pod nodes of the gang being measured (`make_victims`)."""
    lost: set[str] = field(default_factory=set)
    """Nodes lost so far (`lose_node`)."""
    rss_max: float = 0.0
    peer: AddonProcess | None = None
    """The JobSet controller, when the run restarts that peer too."""

    @property
    def s(self) -> SimKubelet:
        assert self.sim is not None
        return self.sim

    def cpu_pids(self) -> dict[str, int]:
        """The processes whose CPU a repetition accounts for, by name: the controller, each of
        the cluster's (kube-apiserver, etcd, ...), and the peer's controller."""
        assert self.ctl.proc is not None
        pids = {"controller": self.ctl.proc.pid}
        pids |= {p.name: p.pid for p in self.cluster.procs()}
        if self.peer is not None:
            pids["jobset-controller"] = self.peer.pid
        return pids

    def sample_rss(self) -> float:
        """The controller's RSS now (MiB), kept in `rss_max` if the largest yet."""
        assert self.ctl.proc is not None
        rss = rss_mib(self.ctl.proc.pid)
        self.rss_max = max(self.rss_max, rss)
        return rss

    def timeout(self, per_pod: float, base: float = 90.0) -> float:
        return base + per_pod * self.n


def gangjob(
    name: str,
    ns: str,
    replicas: int,
    mode: str,
    hang_seconds: int | None = None,
    spec: JsonDict | None = None,
    own_nodes: bool = False,
) -> JsonDict:
    """The benchmark's gang; `spec`: more of its spec (e.g. `progress`, `failurePolicy`). A
    gang given nodes of its own (`make_victims`) prefers them, so that each holds one of its
    workers whatever single-pod nodes earlier gangs left."""
    progress = {"progress": {"hangSeconds": hang_seconds}} if hang_seconds else {}
    pod_spec: JsonDict = {"nodeSelector": {BENCH_LABEL: ns}}
    if own_nodes:
        term = {"matchExpressions": [{"key": VICTIMS_LABEL, "operator": "In", "values": [name]}]}
        pod_spec["affinity"] = {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 100, "preference": term}
                ]
            }
        }
    return builders.gangjob(
        name, replicas, namespace=ns,
        image="localhost/busybox:dev", command=["sh", "-c", "sleep infinity"],
        pod_spec=pod_spec,
        # The simulated kubelet, not KWOK, finishes these pods' deletion (by UID).
        pod_labels={SIMULATED_KUBELET_LABEL: "true"},
        restart_mode=mode, max_restarts=1000,
        # The benchmark measures the restart, not the guard's wait (60 s by default).
        spec={"nodeLoss": {"forceDeleteAfterSeconds": 0}, **progress, **(spec or {})},
    )  # fmt: skip


async def make_nodes(w: World) -> None:
    """Nodes of this size only: enough of 250 pods for N plus the recreated, and one node of a
    single pod per repetition of node-lost (so losing it loses exactly one worker), which the
    scheduler fills first."""
    bulk = math.ceil(w.n / PODS_PER_NODE) + 1
    short = w.ns[-6:]
    specs = [(f"bench-{short}-b{i}", PODS_PER_NODE) for i in range(bulk)]
    specs += [(f"bench-{short}-v{i}", 1) for i in range(w.settings.reps)]
    for name, pods in specs:
        node = kwok_node(name, Options(pods_per_node=pods))
        node["metadata"]["labels"][BENCH_LABEL] = w.ns
        if pods != 1:
            # The scheduler then fills the single-pod nodes first (TaintToleration scores an
            # untainted node above one with a PreferNoSchedule taint it does not tolerate), so
            # each holds a worker; without it which node gets a worker is the scheduler's tie-break.
            node["spec"] = {"taints": [{"key": BULK_TAINT, "effect": "PreferNoSchedule"}]}
        await w.kube.create(NODES, node)
        w.nodes.append(name)
    w.victims = [n for n, p in specs if p == 1]
    w.bulk = [n for n, p in specs if p != 1]
    await _schedulable(w, len(w.nodes), f"N={w.n}: {len(specs)} nodes")


async def make_victims(w: World, gang: str, count: int) -> None:
    """`count` more single-pod nodes, for gang `gang`'s node losses (`w.gang_victims`): made
    before the gang, they are filled first, as `make_nodes`' are."""
    w.gang_victims, w.gang_victims_of = [], gang
    for i in range(count):
        name = f"bench-{w.ns[-6:]}-{gang}{i}"
        node = kwok_node(name, Options(pods_per_node=1))
        node["metadata"]["labels"][BENCH_LABEL] = w.ns
        node["metadata"]["labels"][VICTIMS_LABEL] = gang
        await w.kube.create(NODES, node)
        w.nodes.append(name)
        w.gang_victims.append(name)
    await _schedulable(w, len(w.nodes), f"N={w.n}: {count} nodes for {gang}")


async def _schedulable(w: World, count: int, what: str) -> None:
    progress = Progress(what)
    while True:
        listed = await w.kube.list(NODES, label_selector=f"{BENCH_LABEL}={w.ns}")
        # The nodes lost by earlier measurements stay NotReady.
        lost = sum(1 for n in listed.items if n["metadata"]["name"] in w.lost)
        ready = sum(1 for n in listed.items if _node_ready(n) and not _kept_off(n))
        if ready + lost >= count:
            return
        progress.tick(f"{ready}/{count - lost} Ready and schedulable")
        await asyncio.sleep(0.5)  # KWOK's node heartbeat: no event to wait on more cheaply


def _kept_off(node: JsonDict) -> bool:
    """A NoSchedule taint is still on the node: the controller-manager takes
    `node.kubernetes.io/not-ready` off a new node a moment after it turns Ready, and until then
    the scheduler puts no worker there (a single-pod node left empty skips node-lost)."""
    taints = node.get("spec", {}).get("taints") or []
    return any(t.get("effect") == "NoSchedule" for t in taints)


def _node_ready(node: JsonDict) -> bool:
    conds = node.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


async def lose_node(kube: Kube, node: str) -> None:
    """What a dead node looks like (tests/integration/test_restart.py injects it so too): KWOK no
    longer plays its kubelet, Ready Unknown, the unreachable taints.

    KWOK keeps the nodes it took on before the annotation changed: it renews their Leases, and
    once (after an apiserver restart) it wrote the node's Ready status back; the node lifecycle
    controller then lifted the taints and the scheduler put new workers on the dead node. Its
    status is therefore also marked ours (`kwok.x-k8s.io/status: custom`, which KWOK leaves
    alone), as a dead node's status is nobody's to write."""
    annotations = {KWOK_NODE_ANNOTATION: "lost", KWOK_STATUS_ANNOTATION: "custom"}
    await kube.patch(NODES, node, {"metadata": {"annotations": annotations}})
    got = await kube.get(NODES, node)
    conds = got["status"]["conditions"]
    for c in conds:
        if c["type"] == "Ready":
            c.update(
                status="Unknown", reason="NodeStatusUnknown", message="Kubelet stopped posting"
            )
    await kube.patch_status(NODES, node, {"status": {"conditions": conds}})
    taints = [
        {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
    ]
    await kube.patch(NODES, node, {"spec": {"taints": taints}})


async def start_gang(
    w: World,
    name: str,
    mode: str,
    tracker: JobTracker,
    hang_seconds: int | None = None,
    spec: JsonDict | None = None,
) -> float:
    """Creates the gang and waits until every agent runs past the barrier of epoch 0."""
    t0 = time.monotonic()
    own = bool(w.gang_victims) and w.gang_victims_of == name
    job = gangjob(name, w.ns, w.n, mode, hang_seconds, spec, own_nodes=own)
    await w.kube.create(GANGJOBS, job, w.ns)
    progress = Progress(f"N={w.n} {mode} gang starting")
    n = w.n
    await milestones(
        {
            "barrier": lambda: tracker.barrier_at.get(0),
            "open": polled(lambda: agents_at(w.s, 0, opened=True) == n),
        },
        w.timeout(0.15, 180),
        progress,
        lambda: (
            f"{pods_where(w.s, running)}/{n} Running, "
            f"{agents_at(w.s, 0, opened=True)}/{n} agents past the barrier"
        ),
    )
    return time.monotonic() - t0


async def steady(
    w: World,
    tracker: JobTracker,
    epoch: int,
    *,
    members: int | None = None,
    pods: int | None = None,
) -> None:
    """Until the gang runs at `epoch` again with nothing left in flight: its `members` (the
    world, N by default) past the barrier and its `pods` (N by default; with spares, more)
    running."""
    n = w.n if members is None else members
    want = w.n if pods is None else pods
    await milestones(
        {
            "barrier": lambda: tracker.barrier_at.get(epoch),
            "open": polled(lambda: agents_at(w.s, epoch, opened=True) == n),
            "running": polled(lambda: pods_where(w.s, running) == want),
        },
        w.timeout(0.1),
        Progress(f"N={w.n} settling at epoch {epoch}"),
        lambda: f"{agents_at(w.s, epoch, opened=True)}/{n} open",
    )
    # The simulated kubelets' status writes of the last restart go on after its barrier (their
    # status manager writes asynchronously, as the kubelet's does): at N=1000 a repetition that
    # started on that backlog saw its failure ~20 s late. Measure from a quiet apiserver.
    try:
        async with asyncio.timeout(w.timeout(0.1)):
            await w.s.status.drained()
    except TimeoutError:
        print(f"N={w.n}: status writes still unsent after settling; measuring anyway", flush=True)
    await asyncio.sleep(1.0)  # let the last writes' watch events drain before measuring


TEARDOWN_CONCURRENCY = 32
"""Pod deletes in flight at a gang's teardown."""
TEARDOWN_JOB_SECONDS = 600.0
"""How long a gang's teardown asks again for its GangJob's delete while the apiserver cannot
answer: after an overrun at N=5000 (arrival by annotation) etcd's writes were timing out, the
delete's retries ran out, and the run ended without writing what it had measured at that size."""


async def delete_job(
    kube: Kube, name: str, ns: str, *, within: float = TEARDOWN_JOB_SECONDS
) -> None:
    """The GangJob deleted (or already gone), asking again on errors worth retrying (429, 5xx,
    a broken or timed-out connection) for up to `within` seconds."""
    deadline = time.monotonic() + within
    attempt = 0
    while True:
        attempt += 1
        try:
            await kube.delete(GANGJOBS, name, ns)
            return
        except NotFound:
            return
        except KubeError as e:
            if not e.retriable or time.monotonic() >= deadline:
                raise
            delay = min(2.0 * attempt, 15.0)
            print(f"deleting gang {ns}/{name}: {e}; asking again in {delay:.0f}s",
                  file=sys.stderr, flush=True)  # fmt: skip
            await asyncio.sleep(delay)


async def teardown_gang(w: World, name: str) -> None:
    """The gang and its pods gone quickly: the job deleted (its garbage collection, at the
    controller-manager's ~20 requests/s, finds the pods gone), and the pods deleted by name with
    grace 0, `TEARDOWN_CONCURRENCY` at once. One deletecollection would run them one after
    another (the apiserver's `--delete-collection-workers` is 1): at N=5000 it outlasted the
    request timeout several times over."""
    await delete_job(w.kube, name, w.ns)
    path = f"/api/v1/namespaces/{w.ns}/pods"
    slots = asyncio.Semaphore(TEARDOWN_CONCURRENCY)
    progress = Progress(f"N={w.n} deleting {name}")
    deleted = 0

    async def delete(pod: str) -> None:
        nonlocal deleted
        async with slots:
            for attempt in range(1, 21):
                try:
                    await w.api.delete(f"{path}/{pod}", {"gracePeriodSeconds": 0})
                    deleted += 1
                    progress.tick(f"{deleted}/{len(mine)} pods deleted")
                    return
                except ApiError as e:
                    if e.status == 404:
                        return
                    if e.status not in (409, 429, 500, 503, 504):
                        raise
                except ClientError:
                    pass  # a broken connection on a loaded machine: ask again
                await asyncio.sleep(0.1 * attempt)

    mine = [p for p, pod in w.s.pods.items() if _labels(pod).get(LABEL_NAME) == name]
    await asyncio.gather(*(delete(p) for p in mine))
    await milestones(
        {"gone": polled(lambda: not w.s.pods)}, w.timeout(0.1),
        progress, lambda: f"{len(w.s.pods)} pods left",
    )  # fmt: skip


def _labels(pod: JsonDict) -> dict[str, str]:
    return dict(pod.get("metadata", {}).get("labels") or {})


def ensure_cluster(settings: Settings) -> tuple[Cluster, bool]:
    """The cluster up with the scheduler QPS asked for; whether this run started it."""
    cluster = Cluster(settings.cluster)
    want = Options(
        profile="sim",
        nodes=1,
        scheduler_qps=settings.scheduler_qps,
        endpoint_batch_seconds=settings.endpoint_batch,
    )
    if cluster.is_up():
        opts = cluster.load().get("options", {})
        wanted = want.to_json()
        if all(opts.get(k) == wanted[k] for k in ("scheduler_qps", "endpoint_batch_seconds")):
            return cluster, False
        print(f"restarting cluster {cluster.name!r} for scheduler QPS "
              f"{settings.scheduler_qps}, endpoint batching {settings.endpoint_batch}",
              file=sys.stderr)  # fmt: skip
        cluster.down(sys.stderr)
    cluster.up(want, sys.stderr)
    return cluster, True
