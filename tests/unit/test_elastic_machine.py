"""A hypothesis state machine over an elastic gang (docs/design.md section 3.12): `plan`'s passes
interleaved arbitrarily with resizes of `spec.replicas` within the bounds, nodes lost (and
workers that then find no room, so that the gang shrinks, and grows back on a new node), trainers
crashing, pods deleted by others, deletions that reach a pod's agent late, and the agents'
own decisions (`agent.protocol`: `target_epoch`, `barrier`, `in_world`, `epoch_env`) starting
trainers; with 0 to 2 spares (`elastic.spares`), which take a recreated worker's place.
Checked throughout:

- a rank is never given to two workers (pod UIDs) in one epoch, every rank given is below the
  epoch's `WORLD_SIZE`, and ranks are dense: the epoch's workers, in order, hold
  `0..WORLD_SIZE-1` (workers lost without capacity dropped, and spares, `status.dropped`);
- a spare is never counted in `WORLD_SIZE`: the world never exceeds `replicas`, and no
  spare's trainer is started;
- one bump per pass at most, and the world size changes only with a bump;
- the barrier opens only with exactly the epoch's world arrived;
- planning is repeatable, and a pass over the outcome of a pass repeats nothing.
"""

from __future__ import annotations

import copy
import itertools
import re
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, currently_in_test_context, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from agent.protocol import (
    Barrier,
    JobState,
    barrier,
    dense_rank,
    epoch_env,
    in_world,
    target_epoch,
)
from api.builders import leader_and_elastic
from api.constants import ENV_RANK, ENV_WORLD_SIZE, REASON_SPARE_TOOK_OVER
from api.v1alpha1 import (
    GangJob,
    GangJobStatus,
    Phase,
    Place,
    dump_gangjob,
    dump_status,
    parse_gangjob,
)
from controller.policy import classify
from controller.policy.plan import Observed, Plan, plan
from controller.policy.views import NodeView, PodView
from tests.unit.builders import T0, job_dict, make_node
from tests.unit.test_protocol_machine import SimPod, _stamp

MAX = 6
NODES = ("node-0", "node-1", "node-2")
CAPACITY = 2
"""Pods a node holds: a lost node's workers may find no room, and the gang shrinks."""


class ElasticMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        self.pods: dict[str, SimPod] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.uids = itertools.count()
        self.node_names = itertools.count(len(NODES))
        self.obj: dict[str, Any] = {}
        self.outages = 0
        self.given: dict[int, dict[int, str]] = {}
        """Epoch -> rank -> the UID of the pod whose trainer was given it."""
        self.running: dict[str, int] = {}
        """Pod UID -> the epoch its trainer was started at (one run per epoch)."""
        self.worlds: dict[int, int] = {}
        """Epoch -> its world size, as the status said it when first seen."""
        self.resizes = 0
        self.unschedulable: dict[str, str] = {}
        """Pod UID -> when the scheduler found no node for it."""

    @initialize(
        replicas=st.integers(1, MAX),
        barrier_timeout=st.sampled_from([60, 100000]),
        spares=st.integers(0, 2),
        wait=st.sampled_from([0, 60]),
    )
    def start(self, replicas: int, barrier_timeout: int, spares: int = 0, wait: int = 60) -> None:
        self.obj = self.job_body(replicas, barrier_timeout, spares, wait)
        self.nodes = {name: make_node(name) for name in NODES}

    fixed = 0
    """Workers of roles that are not elastic, numbered before the elastic ones."""

    def job_body(self, replicas: int, barrier_timeout: int, spares: int, wait: int) -> Any:
        return job_dict(
            replicas,
            restart={
                "mode": "Process",
                "maxRestarts": 1000,
                "barrierTimeoutSeconds": barrier_timeout,
            },
            elastic={
                "minReplicas": 1,
                "maxReplicas": MAX,
                "waitSeconds": wait,
                "growAfterSeconds": 100,
                "spares": spares,
            },
        )

    def set_replicas(self, replicas: int) -> None:
        self.obj["spec"]["replicas"] = replicas

    @property
    def job(self) -> GangJob:
        return parse_gangjob(self.obj)

    @property
    def finished(self) -> bool:
        return self.job.status.phase in (Phase.SUCCEEDED, Phase.FAILED)

    def render(self, pod: SimPod) -> dict[str, Any]:
        out = pod.render()
        since = self.unschedulable.get(pod.uid)
        if pod.node is None and since is not None:
            out["status"]["conditions"].append(
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "lastTransitionTime": since,
                }
            )
        return out

    def observe(self) -> Observed:
        return Observed(
            job=self.job,
            pods=[PodView.from_pod(self.render(p)) for p in self.pods.values()],
            nodes={name: NodeView.from_node(n) for name, n in self.nodes.items()},
            service_exists=True,
            now=self.now,
        )

    def healthy(self, node: str | None) -> bool:
        if node is None or node not in self.nodes:
            return False
        return classify.node_lost(node, NodeView.from_node(self.nodes[node])) is None

    def carry_out(self, result: Plan) -> None:
        for delete in result.delete_pods:
            pod = self.pods.get(delete.name)
            if pod is None or pod.uid != delete.uid:
                continue
            if delete.grace_seconds == 0:
                del self.pods[delete.name]
            elif pod.deleted_at is None:
                pod.deleted_at = self.now
        for manifest in result.create_pods:
            name = manifest["metadata"]["name"]
            assert name not in self.pods, f"{name} created twice"
            self.pods[name] = SimPod(
                manifest=copy.deepcopy(manifest), uid=f"uid-{next(self.uids)}", created_at=self.now
            )
        written = self.job.model_copy(update={"status": result.status})
        self.obj = dump_gangjob(written)

    # --- the controller -------------------------------------------------------------------

    @rule()
    def reconcile(self) -> None:
        before = self.observe()
        old = before.job.status
        result = plan(before)
        assert plan(self.observe()) == result
        new = result.status
        assert old.epoch <= new.epoch <= old.epoch + 1
        if old.world_size is not None and new.world_size != old.world_size:
            assert new.epoch == old.epoch + 1, "the world changed without a bump"
        elastic = before.job.spec.elasticity
        assert elastic is not None
        replicas = len(before.job.spec.workers) - elastic.bounds.spares
        assert new.world_size is not None
        assert all(d >= self.fixed for d in new.dropped), "a worker of a fixed role dropped"
        assert new.world_size <= replicas, "a spare in the world"
        if new.barrier_epoch != old.barrier_epoch:
            assert new.barrier_epoch == new.epoch
            size = before.job.spec.world_size
            assert new.world_size == size - len(new.dropped)
            deleted = {d.name for d in result.delete_pods}
            members = sorted(
                p.rank
                for p in before.pods
                if p.rank is not None
                and not p.terminating
                and p.name not in deleted
                and p.arrived_epoch == new.epoch
                and p.rank < size
                and p.rank not in new.dropped
            )
            assert members == sorted(set(range(size)) - set(new.dropped)), members
        swaps = [
            (int(m[1]), int(m[2]))
            for e in result.events
            if e.reason == REASON_SPARE_TOOK_OVER
            and (m := re.match(r"Spare (\d+) takes worker (\d+)'s place", e.message))
        ]
        if swaps:
            self.check_swap_keeps_ranks(old, new, swaps)
            if currently_in_test_context():
                event("a spare took a worker's place")
        self.carry_out(result)
        again = plan(self.observe())
        assert again.create_pods == []
        assert again.status == self.job.status
        assert again.restart_started is None

    @staticmethod
    def check_swap_keeps_ranks(
        old: GangJobStatus, new: GangJobStatus, swaps: list[tuple[int, int]]
    ) -> None:
        """A bump whose only change of the world is spares taking lost workers' places gives
        each spare the rank its worker had, and moves no other worker's rank."""
        detail = new.last_restart.trigger.detail if new.last_restart else None
        if "resized" in (detail or ""):
            return

        def ranks(status: GangJobStatus) -> dict[int, int | None]:
            state = JobState.from_object({"status": dump_status(status)})
            spanned = (status.world_size or 0) + len(status.dropped)
            return {w: dense_rank(w, state.dropped, state.places) for w in range(spanned)}

        before, after = ranks(old), ranks(new)
        taken = {worker for _, worker in swaps}
        for spare, worker in swaps:
            assert after[spare] == before[worker], (spare, worker, before, after)
        for w, rank in before.items():
            if rank is not None and w not in taken and w in after:
                assert after[w] == rank, (w, before, after)

    @precondition(lambda self: not self.finished and self.resizes < 6)
    @rule(replicas=st.integers(1, MAX))
    def resize(self, replicas: int) -> None:
        """`gangjob scale`: the apiserver takes any size within the bounds."""
        self.resizes += 1
        self.set_replicas(replicas)

    # --- time, the kubelet, the agents -----------------------------------------------------

    @rule(seconds=st.sampled_from([1, 30, 70, 130]))
    def tick(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    def room(self, node: str) -> bool:
        held = sum(1 for p in self.pods.values() if p.node == node)
        return self.healthy(node) and held < CAPACITY

    @rule()
    def kubelet(self) -> None:
        """Deletions on healthy nodes end (the agent with them); pods are placed on a healthy
        node with room, else found unschedulable, and run."""
        for name, pod in list(self.pods.items()):
            if pod.node is None and pod.deleted_at is None:
                pod.node = next((n for n in sorted(self.nodes) if self.room(n)), None)
                if pod.node is None:
                    self.unschedulable.setdefault(pod.uid, _stamp(self.now))
            if not self.healthy(pod.node):
                continue
            if pod.deleted_at is not None:
                del self.pods[name]
                self.running.pop(pod.uid, None)
            elif pod.phase == "Pending":
                pod.phase = "Running"
                pod.ready = True
                pod.trainer = {"running": {"startedAt": _stamp(self.now)}}

    def _agent_alive(self, pod: SimPod) -> bool:
        # A pod being deleted keeps its agent until its kubelet ends it (`kubelet`).
        return pod.phase == "Running" and self.healthy(pod.node) and not self.finished

    @rule()
    def agents_arrive(self) -> None:
        """Every live agent below the gang's epoch arrives at it (`target_epoch`)."""
        epoch = self.job.status.epoch
        for pod in self.pods.values():
            if not self._agent_alive(pod):
                continue
            target = target_epoch(pod.arrived, epoch)
            if target is not None:
                pod.arrived = target
                pod.exit_report = None

    @rule()
    def agents_start_trainers(self) -> None:
        """Every live agent at an open barrier starts its trainer there, as `Agent` does:
        unless it is outside the epoch's world (`in_world`), with `epoch_env`."""
        state = JobState.from_object(self.obj)
        for pod in self.pods.values():
            if not self._agent_alive(pod) or pod.arrived is None:
                continue
            if barrier(state, pod.arrived) is not Barrier.OPEN:
                continue
            if self.running.get(pod.uid) == pod.arrived or pod.failed_at(pod.arrived):
                continue
            if not in_world(pod.rank, state):
                continue
            assert pod.rank not in state.dropped, "a spare's trainer started"
            rank_given = dense_rank(pod.rank, state.dropped, state.places)
            env = epoch_env(pod.arrived, rank_given, state.world_size)
            rank, world = int(env[ENV_RANK]), int(env[ENV_WORLD_SIZE])
            self.worlds.setdefault(pod.arrived, world)
            assert self.worlds[pod.arrived] == world, "two worlds in one epoch"
            assert 0 <= rank < world
            # Dense: the workers of the epoch, in the order of their places (a spare in the
            # place of the worker it replaced), hold ranks 0..world-1.
            status = self.job.status
            places = {pl.worker: pl.place for pl in status.places}
            members = sorted(
                set(range(world + len(status.dropped))) - set(status.dropped),
                key=lambda w: (places.get(w, w), w),
            )
            assert len(members) == world
            assert rank == members.index(pod.rank), (rank, pod.rank, status.dropped, places)
            holder = self.given.setdefault(pod.arrived, {}).setdefault(rank, pod.uid)
            assert holder == pod.uid, f"rank {rank} given twice at epoch {pod.arrived}"
            self.running[pod.uid] = pod.arrived

    @rule()
    def gang_settles(self) -> None:
        """The next few seconds, before any kubelet ends a deletion: passes, arrivals and
        starts (where a surplus worker whose deletion has not reached it yet meets the new
        epoch's open barrier)."""
        self.reconcile()
        self.agents_arrive()
        self.reconcile()
        self.agents_start_trainers()

    @rule(data=st.data())
    def trainer_crashes(self, data: st.DataObject) -> None:
        running = sorted(uid for uid, e in self.running.items() if e == self.job.status.epoch)
        if not running:
            return
        uid = data.draw(st.sampled_from(running))
        pod = next((p for p in self.pods.values() if p.uid == uid), None)
        if pod is None or pod.arrived is None:
            return
        pod.exit_report = f"{pod.arrived}:1"
        del self.running[uid]

    # --- infrastructure -------------------------------------------------------------------

    @precondition(lambda self: self.outages < 3 and any(self.healthy(n) for n in self.nodes))
    @rule(data=st.data())
    def node_lost(self, data: st.DataObject) -> None:
        node = data.draw(st.sampled_from(sorted(n for n in self.nodes if self.healthy(n))))
        self.outages += 1
        self.nodes[node]["spec"]["taints"] = [
            {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}
        ]
        self.nodes[node]["status"]["conditions"] = [{"type": "Ready", "status": "Unknown"}]

    @precondition(lambda self: len(self.nodes) < 5)
    @rule()
    def node_added(self) -> None:
        name = f"node-{next(self.node_names)}"
        self.nodes[name] = make_node(name)

    @rule(data=st.data())
    def pod_deleted_by_someone(self, data: st.DataObject) -> None:
        live = sorted(name for name, p in self.pods.items() if p.deleted_at is None)
        if live:
            self.pods[data.draw(st.sampled_from(live))].deleted_at = self.now

    @invariant()
    def status_is_consistent(self) -> None:
        if not self.obj:
            return
        status = self.job.status
        assert status.barrier_epoch is None or status.barrier_epoch <= status.epoch
        if status.world_size is not None:
            assert 1 + self.fixed <= status.world_size <= MAX + self.fixed


ElasticMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestElasticMachine = ElasticMachine.TestCase


class ElasticRoleMachine(ElasticMachine):
    """The same over an elastic role (`spec.roles[].elastic`): a fixed role `leader` of
    `fixed` workers (the coordinator among them), then the elastic role `worker`, whose
    workers are numbered after them. Also checked: a leader is never dropped, spared nor
    removed, and the world never falls below the leaders and `minReplicas`."""

    fixed = 2

    def job_body(self, replicas: int, barrier_timeout: int, spares: int, wait: int) -> Any:
        body = super().job_body(replicas, barrier_timeout, spares, wait)
        elastic = body["spec"].pop("elastic")
        return leader_and_elastic(body, replicas, elastic, self.fixed)

    def set_replicas(self, replicas: int) -> None:
        self.obj["spec"]["roles"][-1]["replicas"] = replicas


ElasticRoleMachine.TestCase.settings = ElasticMachine.TestCase.settings
TestElasticRoleMachine = ElasticRoleMachine.TestCase


class _Draw:
    """`data.draw` answering one value, for a scripted run of the machine."""

    def __init__(self, value: str) -> None:
        self.value = value

    def draw(self, _strategy: object) -> str:
        return self.value


def test_a_node_lost_without_capacity_shrinks_with_dense_ranks_and_grows_back() -> None:
    """The machine's rarest path, scripted: 6 workers two a node; node-1 (workers 2, 3) is
    lost and nothing has room for them; the gang goes on as 4, ranks dense; a node comes back
    and, `growAfterSeconds` later, the gang is 6 again."""
    m = ElasticMachine()
    m.start(6, 100000)
    for _ in range(3):
        m.kubelet()
        m.gang_settles()
    m.node_lost(_Draw("node-1"))
    m.gang_settles()
    m.tick(70)  # its pods are force-deleted; the new ones find no room
    for _ in range(2):
        m.kubelet()
        m.gang_settles()
    m.tick(70)  # past waitSeconds
    m.kubelet()
    m.gang_settles()
    status = m.job.status
    assert (status.epoch, status.barrier_epoch, status.world_size) == (2, 2, 4)
    assert status.dropped == [2, 3]
    assert status.last_restart is not None
    assert status.last_restart.trigger.detail == "resized 6 -> 4 (node lost, no capacity)"
    first = m.given[0]
    assert m.given[2] == {0: first[0], 1: first[1], 2: first[4], 3: first[5]}
    m.node_added()
    m.kubelet()
    m.gang_settles()
    assert m.job.status.epoch == 2  # placed, but growAfterSeconds have not passed
    m.tick(130)
    m.kubelet()
    m.gang_settles()
    m.gang_settles()
    status = m.job.status
    assert (status.epoch, status.barrier_epoch, status.world_size) == (3, 3, 6)
    assert status.dropped == []
    assert status.last_restart is not None
    assert status.last_restart.trigger.detail == "resized 4 -> 6 (capacity returned)"
    assert sorted(m.given[3]) == list(range(6))
    assert {m.given[3][r] for r in (0, 1, 4, 5)} == {first[0], first[1], first[4], first[5]}


def _lose(machine: ElasticMachine, node: str) -> None:
    machine.outages += 1
    machine.nodes[node]["spec"]["taints"] = [
        {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}
    ]
    machine.nodes[node]["status"]["conditions"] = [{"type": "Ready", "status": "Unknown"}]


def test_a_resize_drops_the_workers_that_cannot_be_placed_in_its_own_bump() -> None:
    # Found by the machine: 4 -> 3 with worker 2 unschedulable past waitSeconds bumped for the
    # resize, and the next pass, over the same world, bumped again to drop worker 2.
    m = ElasticMachine()
    m.start(replicas=1, barrier_timeout=60)
    m.agents_arrive()
    _lose(m, "node-0")
    _lose(m, "node-1")
    m.resize(replicas=4)
    m.gang_settles()
    m.kubelet()
    m.resize(replicas=3)
    m.tick(seconds=70)
    m.gang_settles()  # asserts that planning again over each pass's outcome changes nothing
    assert m.job.status.last_restart is not None
    assert m.job.status.last_restart.trigger.detail == (
        "resized 4 -> 2 (replicas changed; node lost, no capacity)"
    )


def test_a_smaller_size_that_only_takes_dropped_workers_is_no_bump() -> None:
    # Found by the machine: 4 workers, 2 and 3 dropped; `replicas: 3` took only dropped
    # worker 3 away, yet bumped ("resized 2 -> 2"), and the next pass grew worker 2 back in
    # another bump. Now the world's members are what decides a bump.
    m = ElasticMachine()
    m.start(replicas=1, barrier_timeout=60)
    _lose(m, "node-0")
    _lose(m, "node-1")
    m.resize(replicas=4)
    m.gang_settles()
    m.kubelet()
    m.node_added()
    _lose(m, "node-2")
    m.tick(seconds=71)
    m.gang_settles()
    m.resize(replicas=3)
    m.kubelet()
    m.gang_settles()
    details = [r.trigger.detail for r in m.job.status.history]
    if m.job.status.last_restart is not None:
        details.append(m.job.status.last_restart.trigger.detail)
    assert not any("2 -> 2" in (d or "") for d in details), details


def test_the_stuck_cause_of_a_worker_its_barrier_timeout_recreates_is_planned_once() -> None:
    # Found by the machine: 4 workers, every node lost; worker 0's new pod found no node for
    # waitSeconds (ElasticAtMinimum: it holds MASTER_ADDR), and the same pass's barrier
    # timeout deleted it. Stuck was judged over the deleted pod, so the next pass, seeing no
    # pod, named another cause (BarrierStalled) for the same world.
    m = ElasticMachine()
    m.start(replicas=1, barrier_timeout=60)
    m.resize(replicas=4)
    m.reconcile()
    m.kubelet()
    m.agents_arrive()
    m.node_lost(_Draw("node-0"))
    m.pod_deleted_by_someone(_Draw("llama-0"))
    m.node_lost(_Draw("node-1"))
    m.node_lost(_Draw("node-2"))
    m.tick(70)
    m.reconcile()
    m.kubelet()
    m.tick(130)
    m.reconcile()  # replans its own outcome: the same status
    stuck = next(c for c in m.job.status.conditions if c.type == "Stuck")
    assert stuck.reason == "BarrierStalled"


def test_a_spare_takes_a_lost_workers_place_in_place_and_the_new_pod_becomes_a_spare() -> None:
    """5 workers and one spare, two a node: node-1 (workers 2, 3) is lost; spare 5 takes
    worker 2's place in the bump of the loss (its pod kept: no scheduling, no start), worker 3
    is waited for; worker 2's new pod is out of the world, a spare."""
    m = ElasticMachine()
    m.start(5, 100000, spares=1)
    for _ in range(3):
        m.kubelet()
        m.gang_settles()
    assert (m.job.status.world_size, m.job.status.dropped) == (5, [5])
    assert sorted(m.given[0]) == list(range(5))
    spare = m.pods["llama-5"].uid
    assert spare not in m.given[0].values()
    m.node_added()
    m.node_lost(_Draw("node-1"))
    m.gang_settles()
    status = m.job.status
    assert (status.epoch, status.world_size, status.dropped) == (1, 5, [2])
    assert status.last_restart is not None
    assert (status.last_restart.trigger.detail or "").endswith("; spare 5 takes worker 2's place")
    m.tick(70)  # the lost pods are force-deleted; the new ones go to node-3
    for _ in range(3):
        m.kubelet()
        m.gang_settles()
    status = m.job.status
    assert (status.epoch, status.barrier_epoch, status.world_size) == (1, 1, 5)
    first = m.given[0]
    assert m.given[1][2] == spare  # worker 2's rank: the spare holds its place
    assert status.places == [Place(worker=5, place=2)]
    assert [m.given[1][r] for r in (0, 1, 4)] == [first[0], first[1], first[4]]  # kept
    assert m.pods["llama-2"].uid not in m.given[1].values()
    assert m.pods["llama-2"].node == "node-3"  # placed: the next spare


def test_a_laggard_recreated_at_the_minimum_says_the_same_stuck_reason_twice() -> None:
    # Found by the machine: with waitSeconds 0, the pass that recreated worker 0 (past the
    # barrier timeout, no node for it) said ElasticAtMinimum of the pod it deleted, and the
    # next pass, seeing it terminating, BarrierStalled.
    m = ElasticMachine()
    m.start(replicas=1, barrier_timeout=60, spares=0, wait=0)
    m.resize(replicas=2)
    m.gang_settles()
    for node in ("node-0", "node-1", "node-2"):
        m.node_lost(_Draw(node))
    m.kubelet()
    m.gang_settles()
    m.tick(70)
    m.gang_settles()  # asserts that planning again over each pass's outcome changes nothing
    status = m.job.status
    assert (status.world_size, status.dropped) == (1, [1])


def test_a_worker_put_out_of_the_world_on_a_lost_node_is_renewed_in_the_same_pass() -> None:
    # Found by the machine: 6 -> 1 with a spare while node-0 (workers 0 and 1) was lost.
    # Worker 1 became the spare in that pass, yet its pod on the lost node was deleted only by
    # the next pass, whose counts then differed (ready 1 -> 0).
    m = ElasticMachine()
    m.start(replicas=1, wait=0, spares=1, barrier_timeout=60)
    m.node_added()
    m.resize(replicas=6)
    m.reconcile()
    m.node_added()
    m.kubelet()
    m.node_lost(_Draw("node-2"))
    m.reconcile()
    m.node_lost(_Draw("node-0"))
    m.resize(replicas=1)
    m.reconcile()  # asserts that planning again over the pass's outcome changes nothing
    status = m.job.status
    assert (status.world_size, status.dropped) == (1, [1])
    assert m.pods["llama-1"].deleted_at is not None  # the spare's pod on node-0 is renewed


class _NoDraw:
    """`data` for a scripted rule that must find nothing to draw from."""

    def draw(self, _strategy: object) -> str:
        raise AssertionError("nothing to draw from was expected")


def test_a_smaller_size_never_takes_the_world_below_its_minimum() -> None:
    # Found by the machine (an elastic role: the world's minimum is the 2 leaders + 1):
    # 2 -> 1 removed worker 4, the one member of the role that was placed, while workers 2
    # and 3 were out for want of room, and the gang went on with the leaders alone.
    m = ElasticRoleMachine()
    m.start(replicas=1, barrier_timeout=60, spares=1, wait=0)
    m.gang_settles()
    m.node_lost(_Draw("node-0"))
    m.node_lost(_Draw("node-1"))
    m.resize(replicas=2)
    m.kubelet()
    m.gang_settles()
    assert m.job.status.dropped == [2, 3]
    m.resize(replicas=1)
    m.reconcile()
    status = m.job.status
    assert (status.world_size, status.dropped) == (3, [3])  # worker 2 is waited for again


def test_workers_waited_for_at_the_minimum_go_in_the_bump_that_grows_the_world() -> None:
    # Found by the machine: at its minimum the gang waited for worker 6 (no room); workers 2
    # and 3 were placed again and rejoined ("capacity returned"), and only the next pass,
    # behind that bump's shut barrier, dropped worker 6 in a second bump.
    m = ElasticRoleMachine()
    m.start(replicas=4, barrier_timeout=100000, wait=60, spares=2)
    m.agents_arrive()
    m.pod_deleted_by_someone(_NoDraw())
    m.trainer_crashes(_NoDraw())
    m.resize(replicas=6)
    m.node_lost(_Draw("node-0"))
    m.reconcile()
    m.resize(replicas=5)
    m.reconcile()
    m.node_lost(_Draw("node-2"))
    m.gang_settles()
    m.node_lost(_Draw("node-1"))
    m.reconcile()
    m.tick(seconds=70)
    m.reconcile()
    m.agents_start_trainers()
    m.tick(seconds=1)
    m.reconcile()
    m.tick(seconds=1)
    m.pod_deleted_by_someone(_Draw("llama-worker-6"))
    m.node_added()
    m.kubelet()
    m.node_added()
    m.agents_arrive()
    m.reconcile()
    m.tick(seconds=130)
    m.reconcile()
    m.resize(replicas=4)
    m.kubelet()
    m.pod_deleted_by_someone(_Draw("llama-leader-0"))
    m.agents_arrive()
    m.reconcile()
    m.agents_arrive()
    m.trainer_crashes(_NoDraw())
    m.reconcile()
    m.tick(seconds=260)
    m.reconcile()  # asserts that planning again over the pass's outcome changes nothing
    status = m.job.status
    assert status.last_restart is not None
    assert status.last_restart.trigger.detail == (
        "resized 3 -> 4 (capacity returned; node lost, no capacity)"
    )
    assert (status.world_size, status.dropped) == (4, [4, 5, 6, 7])
