"""A hypothesis state machine over `controller.policy.plan`: a simulated gang (pods whose agents
arrive at epochs, trainers that crash, nodes that are lost or deleted, pods deleted by others, the
kubelet and the clock moving on) with planner passes interleaved arbitrarily, and the
invariants of docs/design.md section 3 checked after every pass:

- epochs never go down, and go up by at most one per pass;
- one failure causes one bump however many pods report it: a bump from epoch E needs a failure
  injected at E, and failures at E never bump twice;
- the barrier never opens with a worker missing, terminating or below the epoch;
- no worker is counted arrived below (or above) `status.epoch`;
- a controller restarted at any point converges to the same outcome: every status goes through
  the API's JSON round trip, a pass over the outcome of a pass repeats nothing, and planning the
  same objects twice gives the same plan.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from api.v1alpha1 import (
    ExitCodeOperator,
    GangJob,
    Phase,
    RestartMode,
    dump_gangjob,
    parse_gangjob,
)
from controller.policy import classify
from controller.policy.plan import Observed, Plan, plan
from controller.policy.views import NodeView, PodView
from tests.unit.builders import JOB_UID, T0, job_dict, make_node

REPLICAS = 3
NODES = ("node-0", "node-1", "node-2")


def _stamp(value: datetime) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class SimPod:
    """A worker pod as the simulation keeps it; `render` makes the API's dict of it."""

    manifest: dict[str, Any]
    uid: str
    created_at: datetime
    node: str | None = None
    phase: str = "Pending"
    ready: bool = False
    arrived: int | None = None
    deleted_at: datetime | None = None
    trainer: dict[str, Any] | None = None
    """The trainer's `state`."""
    last: dict[str, Any] | None = None
    """The trainer's `lastState.terminated`."""
    restarting: bool = False
    """The transient `AllContainersRestarting` condition."""
    exit_report: str | None = None

    @property
    def name(self) -> str:
        name: str = self.manifest["metadata"]["name"]
        return name

    @property
    def rank(self) -> int:
        return int(self.manifest["metadata"]["labels"]["gangjob.io/rank"])

    @property
    def created_epoch(self) -> int:
        return int(self.manifest["metadata"]["annotations"]["gangjob.io/created-epoch"])

    @property
    def epoch(self) -> int:
        """The epoch the worker is at (arrived, else created)."""
        return self.arrived if self.arrived is not None else self.created_epoch

    def failed_at(self, epoch: int) -> bool:
        """This worker already failed at `epoch`: its trainer is no longer running there."""
        reported = self.exit_report is not None and self.exit_report.startswith(f"{epoch}:")
        return reported or "terminated" in (self.trainer or {}) or self.restarting

    def render(self) -> dict[str, Any]:
        pod = copy.deepcopy(self.manifest)
        meta = pod["metadata"]
        meta["uid"] = self.uid
        meta["creationTimestamp"] = _stamp(self.created_at)
        if self.deleted_at is not None:
            meta["deletionTimestamp"] = _stamp(self.deleted_at)
        if self.arrived is not None:
            meta["annotations"]["gangjob.io/epoch"] = str(self.arrived)
        if self.exit_report is not None:
            meta["annotations"]["gangjob.io/exit"] = self.exit_report
        if self.node is not None:
            pod["spec"]["nodeName"] = self.node
        conditions = [{"type": "Ready", "status": "True" if self.ready else "False"}]
        if self.restarting:
            conditions.append({"type": "AllContainersRestarting", "status": "True"})
        trainer: dict[str, Any] = {
            "name": "trainer",
            "ready": self.ready,
            "state": self.trainer or {"waiting": {"reason": "PodInitializing"}},
        }
        if self.last is not None:
            trainer["lastState"] = {"terminated": self.last}
        pod["status"] = {
            "phase": self.phase,
            "conditions": conditions,
            "containerStatuses": [trainer],
        }
        return pod


class GangMachine(RuleBasedStateMachine):
    """A gang under a controller whose passes come whenever hypothesis likes."""

    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        self.pods: dict[str, SimPod] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.uids = itertools.count()
        self.node_names = itertools.count(len(NODES))
        self.failures_at: dict[int, int] = {}
        """Failures injected at each epoch: a bump from E needs one at E."""
        self.bumped_from: set[int] = set()
        self.outages = 0
        """Nodes lost or deleted so far: a few, so that the gang gets to run in between."""
        self.obj: dict[str, Any] = {}

    @initialize(
        mode=st.sampled_from([RestartMode.POD, RestartMode.PROCESS]),
        fail_on_3=st.booleans(),
        max_restarts=st.sampled_from([2, 100]),
        backoff=st.sampled_from([0, 5]),
    )
    def start(self, mode: RestartMode, fail_on_3: bool, max_restarts: int, backoff: int) -> None:
        rules = (
            [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [3]}}]
            if fail_on_3
            else []
        )
        self.obj = job_dict(
            REPLICAS,
            restart={
                "mode": mode.value,
                "maxRestarts": max_restarts,
                "backoffSeconds": backoff,
                "barrierTimeoutSeconds": 120,
            },
            failurePolicy={"rules": rules},
        )
        self.mode = mode
        self.nodes = {name: make_node(name) for name in NODES}

    # --- the world as the API shows it ----------------------------------------------------

    @property
    def job(self) -> GangJob:
        return parse_gangjob(self.obj)

    def observe(self) -> Observed:
        return Observed(
            job=self.job,
            pods=[PodView.from_pod(p.render()) for p in self.pods.values()],
            nodes={name: NodeView.from_node(n) for name, n in self.nodes.items()},
            service_exists=True,
            now=self.now,
        )

    def healthy(self, node: str | None) -> bool:
        if node is None or node not in self.nodes:
            return False
        return classify.node_lost(node, NodeView.from_node(self.nodes[node])) is None

    def worker(self, rank: int) -> SimPod | None:
        return self.pods.get(f"llama-{rank}")

    @property
    def finished(self) -> bool:
        return self.job.status.phase in (Phase.SUCCEEDED, Phase.FAILED)

    def fail_at(self, pod: SimPod) -> None:
        """A failure of this worker: one of the gang's at its epoch if the worker is there."""
        epoch = self.job.status.epoch
        if pod.epoch == epoch:
            self.failures_at[epoch] = self.failures_at.get(epoch, 0) + 1

    # --- the controller -------------------------------------------------------------------

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
        # The status as the API stores it: through JSON, timestamps truncated as the schema says.
        written = self.job.model_copy(update={"status": result.status})
        self.obj = dump_gangjob(written)

    def check(self, before: Observed, result: Plan) -> None:
        old, new = before.job.status, result.status
        # Epochs never go down, and one pass bumps at most once.
        assert old.epoch <= new.epoch <= old.epoch + 1
        if new.epoch > old.epoch:
            # One failure, one bump: a bump needs a failure at the epoch it leaves, and an
            # epoch is left once.
            assert self.failures_at.get(old.epoch, 0) > 0, f"bump from {old.epoch} uncaused"
            assert old.epoch not in self.bumped_from
            self.bumped_from.add(old.epoch)
            assert result.restart_started is not None
            assert result.restart_started.epoch == new.epoch
        # The barrier never opens with a worker missing, terminating, or below the epoch.
        if new.barrier_epoch is not None:
            assert new.barrier_epoch <= new.epoch
        if new.barrier_epoch != old.barrier_epoch:
            assert new.barrier_epoch == new.epoch
            deleted = {d.name for d in result.delete_pods}
            for rank in range(REPLICAS):
                pod = next((p for p in before.pods if p.rank == rank), None)
                assert pod is not None, f"barrier opened with worker {rank} missing"
                assert not pod.terminating
                assert pod.name not in deleted
                assert pod.arrived_epoch == new.epoch, f"worker {rank} not arrived"
        # Only workers at the epoch count as arrived.
        deleted = {d.name for d in result.delete_pods}
        arrived = [
            p
            for p in before.pods
            if not p.terminating and p.name not in deleted and p.arrived_epoch == new.epoch
        ]
        assert new.workers.arrived == len(arrived)
        if old.phase in (Phase.SUCCEEDED, Phase.FAILED):
            assert new.phase == old.phase
            assert new.epoch == old.epoch

    @rule()
    def reconcile(self) -> None:
        before = self.observe()
        result = plan(before)
        # Planning the same objects again gives the same plan: no hidden memory.
        assert plan(self.observe()) == result
        self.check(before, result)
        self.carry_out(result)
        # A controller restarted right after the pass, or a duplicate event: nothing new.
        again = plan(self.observe())
        assert again.events == []
        assert again.create_pods == []
        assert again.status == self.job.status
        assert again.restart_started is None
        assert again.restart_finished is None

    @rule()
    def controller_restarted(self) -> None:
        """A new controller reads the objects and carries on: the same plan as any other."""
        observed = self.observe()
        result = plan(observed)
        self.check(observed, result)
        self.carry_out(result)

    # --- time and the kubelet -------------------------------------------------------------

    @rule(seconds=st.sampled_from([0.4, 1, 3, 30, 70, 130]))
    def tick(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    @rule()
    def kubelet(self) -> None:
        """Kubelets of healthy nodes finish deletions and start pods; the scheduler places
        pods on healthy nodes."""
        for name, pod in list(self.pods.items()):
            if pod.node is None and pod.deleted_at is None:
                pod.node = next((n for n in sorted(self.nodes) if self.healthy(n)), None)
            if not self.healthy(pod.node):
                continue
            if pod.deleted_at is not None:
                del self.pods[name]
            elif pod.phase == "Pending":
                pod.phase = "Running"
                pod.trainer = {"running": {"startedAt": _stamp(self.now)}}

    # --- the agents -----------------------------------------------------------------------

    @rule()
    def gang_settles(self) -> None:
        """Kubelets catch up and every agent that can arrives: the usual next few seconds."""
        self.kubelet()
        for rank in range(REPLICAS):
            self.agent_arrives(rank)

    @rule(rank=st.integers(0, REPLICAS - 1))
    def agent_arrives(self, rank: int) -> None:
        pod = self.worker(rank)
        if pod is None or pod.deleted_at is not None or pod.phase != "Running":
            return
        if not self.healthy(pod.node) or self.finished:
            return
        epoch = self.job.status.epoch
        if pod.arrived is not None and pod.arrived >= epoch:
            return  # the agent's rule: never arrive twice at an epoch
        if pod.arrived is not None and self.mode is RestartMode.POD:
            # The agent exited to restart the pod in place (KEP-5532): synthetic lastState.
            pod.last = {
                "exitCode": 137,
                "reason": "RestartingAllContainers",
                "finishedAt": _stamp(self.now),
            }
            pod.trainer = {"running": {"startedAt": _stamp(self.now)}}
        pod.restarting = False
        pod.arrived = epoch
        pod.ready = True

    @rule(
        rank=st.integers(0, REPLICAS - 1),
        code=st.sampled_from([1, 3, 137]),
        condition_seen=st.booleans(),
    )
    def trainer_crashes(self, rank: int, code: int, condition_seen: bool) -> None:
        """A trainer that runs (barrier open at its epoch) crashes."""
        pod = self.worker(rank)
        status = self.job.status
        if pod is None or pod.deleted_at is not None or not self.healthy(pod.node):
            return
        if pod.arrived != status.epoch or status.barrier_epoch != status.epoch:
            return
        if pod.failed_at(status.epoch):
            return
        self.fail_at(pod)
        if self.mode is RestartMode.PROCESS:
            pod.exit_report = f"{status.epoch}:{code}"
            return
        retriable = classify.retriable_exit_codes(self.job)
        assert retriable is not None
        operator, values = retriable
        if (code in values) == (operator is ExitCodeOperator.IN):
            # The kubelet restarts the whole pod at once; the real code is lost.
            pod.restarting = condition_seen
            pod.last = {
                "exitCode": 137,
                "reason": "RestartingAllContainers",
                "finishedAt": _stamp(self.now),
            }
            pod.ready = False
        else:
            pod.trainer = {"terminated": {"exitCode": code, "reason": "Error"}}
            pod.ready = False

    @rule(rank=st.integers(0, REPLICAS - 1))
    def transient_condition_passes(self, rank: int) -> None:
        pod = self.worker(rank)
        if pod is not None:
            pod.restarting = False

    # --- infrastructure -------------------------------------------------------------------

    def lose(self, node: str) -> None:
        for pod in self.pods.values():
            if pod.node == node:
                self.fail_at(pod)

    @precondition(lambda self: self.outages < 3 and any(self.healthy(n) for n in self.nodes))
    @rule(data=st.data())
    def node_lost(self, data: st.DataObject) -> None:
        node = data.draw(st.sampled_from(sorted(n for n in self.nodes if self.healthy(n))))
        self.outages += 1
        self.lose(node)
        self.nodes[node]["spec"]["taints"] = [
            {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}
        ]
        self.nodes[node]["status"]["conditions"] = [{"type": "Ready", "status": "Unknown"}]

    @precondition(lambda self: self.outages < 3 and bool(self.nodes))
    @rule(data=st.data())
    def node_deleted(self, data: st.DataObject) -> None:
        node = data.draw(st.sampled_from(sorted(self.nodes)))
        self.outages += 1
        self.lose(node)
        del self.nodes[node]

    @precondition(lambda self: len(self.nodes) < 6)
    @rule()
    def node_added(self) -> None:
        name = f"node-{next(self.node_names)}"
        self.nodes[name] = make_node(name)

    @rule(rank=st.integers(0, REPLICAS - 1))
    def pod_deleted_by_someone(self, rank: int) -> None:
        pod = self.worker(rank)
        if pod is None or pod.deleted_at is not None:
            return
        status = self.job.status
        if status.barrier_epoch == status.epoch:
            self.fail_at(pod)
        pod.deleted_at = self.now

    # --- always ---------------------------------------------------------------------------

    @invariant()
    def status_is_consistent(self) -> None:
        if not self.obj:
            return
        status = self.job.status
        assert status.barrier_epoch is None or status.barrier_epoch <= status.epoch
        assert status.restarts.total == status.epoch
        assert status.restarts.counted <= status.restarts.total
        assert len(status.history) <= 10
        for pod in self.pods.values():
            assert pod.manifest["metadata"]["ownerReferences"][0]["uid"] == JOB_UID


GangMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestGangProtocol = GangMachine.TestCase
