"""A straggler on a real kubelet: one worker's trainer reports a compute per step 2.5 times the
others' from its 45th step on, as a degraded device would make it; the controller finds it
forSeconds later. By default it is only reported (the Warning Event naming its pod and node,
the `Stragglers` condition, `status.progress.stragglers`) and the gang runs on at its epoch;
with a rule on class `Straggler` the controller acts and the job goes on (docs/design.md
section 4.9).

The real node profile has one node: a worker recreated off its node would have nowhere to go,
so the rule here restarts the gang (`RestartGang`); moving the worker to another node is tested
on the sim cluster (tests/integration/test_straggler.py) and measured at N=1000
(`python -m benchmarks.straggler`)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from api import builders
from controller.k8s import GANGJOBS, JsonDict, Kube
from localcluster.cluster import Cluster
from localcluster.node import AGENT_IMAGE
from localcluster.tools import ControllerProcess, kubectl
from tests.integration.harness import gang_pods, watch_job
from tests.integration.test_stuck import warning_event

pytestmark = pytest.mark.e2e

FOR_SECONDS = 10
SLOW_FROM = 45
"""The step from which rank 1 is slow at epoch 0: every agent has sent its first summary by then
(within its 30 s period of the barrier), so the slowdown shows as a shift of its compute."""

# A step a second; each rank's compute 0.40-0.44 s (a little jitter of its own), rank 1's
# 1.00-1.04 s from step SLOW_FROM of epoch 0, when it says when it slowed down.
TRAINER = r"""
trap 'exit 0' TERM
epoch=${GANGJOB_EPOCH:-$(cat "$GANGJOB_DIR/epoch")}
i=0
while :; do
  i=$((i+1))
  c="0.4$(( (i * 7 + RANK * 3) % 5 ))"
  if [ "$RANK:$epoch" = "1:0" ] && [ "$i" -ge SLOW_FROM ]; then
    if [ "$i" = SLOW_FROM ]; then echo "slow-from=$(date +%s)"; fi
    c="1.0$(( i % 5 ))"
  fi
  echo "step=$i compute=$c" > "$GANGJOB_PROGRESS"
  sleep 1
done
""".replace("SLOW_FROM", str(SLOW_FROM))


def gangjob(name: str, mode: str, rules: list[dict[str, Any]] | None = None) -> JsonDict:
    # Process mode runs the agent inside the trainer's container: that image needs python3.
    image = AGENT_IMAGE if mode == "Process" else "localhost/busybox:dev"
    spec: JsonDict = {"progress": {"straggler": {"ratio": 1.5, "forSeconds": FOR_SECONDS}}}
    if rules:
        spec["failurePolicy"] = {"rules": rules}
    return builders.gangjob(
        name, 3,
        image=image, command=["sh", "-c", TRAINER],
        container={"imagePullPolicy": "Never"},
        pod_spec={"terminationGracePeriodSeconds": 5},
        restart_mode=mode,
        spec=spec,
    )  # fmt: skip


def stragglers(job: JsonDict) -> list[int] | None:
    return ((job.get("status") or {}).get("progress") or {}).get("stragglers")


def slow_from(cluster: Cluster, ns: str, pod: str) -> float:
    """When rank 1's trainer said it slowed down (its log, the node's clock: this host's)."""
    log = kubectl(cluster, "logs", "-n", ns, pod, "-c", "trainer")
    return float(next(line for line in log.splitlines() if line.startswith("slow-from="))[10:])


async def test_a_slow_worker_is_reported_by_default_and_a_rule_acts_on_it(
    node_cluster: Cluster, node_kube: Kube, node_namespace: str, controller: ControllerProcess
) -> None:
    """Two gangs side by side, each with its rank 1 slowing down at the same step: `slow`
    (Pod mode, no rule) is only reported; `act` (Process mode, a `RestartGang` rule on class
    `Straggler`) restarts and goes on. Side by side, because each waits out the same steps."""
    ns = node_namespace
    rules = [{"action": "RestartGang", "onFailureClasses": ["Straggler"]}]
    await node_kube.create(GANGJOBS, gangjob("slow", "Pod"), ns)
    await node_kube.create(GANGJOBS, gangjob("act", "Process", rules), ns)
    await asyncio.gather(
        _reported_and_the_gang_runs_on(node_cluster, node_kube, ns),
        _the_rule_acts_and_the_job_goes_on(node_kube, ns),
    )


async def _reported_and_the_gang_runs_on(node_cluster: Cluster, node_kube: Kube, ns: str) -> None:
    job = await watch_job(
        node_kube, ns, "slow", lambda j: stragglers(j) == [1], timeout=SLOW_FROM + 120,
        what="worker 1 found straggling",
    )  # fmt: skip
    found_at = time.time()
    detected = found_at - slow_from(node_cluster, ns, "slow-1")
    print(f"straggler found {detected:.1f}s after it slowed down (forSeconds {FOR_SECONDS})")
    assert FOR_SECONDS - 2 <= detected < FOR_SECONDS + 30
    node = next(p for p in await gang_pods(node_kube, ns, "slow") if p["metadata"]["name"] ==
                "slow-1")["spec"]["nodeName"]  # fmt: skip
    event = await warning_event(node_kube, ns, "slow", "Straggler")
    assert event["message"].startswith(f"worker 1 (pod slow-1) on node {node}: compute 1.0")
    condition = next(c for c in job["status"]["conditions"] if c["type"] == "Stragglers")
    assert (condition["status"], condition["reason"]) == ("True", "StragglersFound")
    # Report only: no restart, and the other workers were never named.
    assert job["status"]["epoch"] == 0
    assert job["status"]["restarts"]["total"] == 0


async def _the_rule_acts_and_the_job_goes_on(node_kube: Kube, ns: str) -> None:
    job = await watch_job(
        node_kube, ns, "act",
        lambda j: (j.get("status") or {}).get("barrierEpoch") == 1
        and j["status"].get("epoch") == 1,
        timeout=SLOW_FROM + 150, what="restarted at epoch 1 for the straggler",
    )  # fmt: skip
    last = job["status"]["lastRestart"]
    assert (last["trigger"]["class"], last["trigger"]["worker"]) == ("Straggler", 1), last
    assert last["trigger"]["action"] == "RestartGang"
    assert "its role's median" in last["trigger"]["detail"]
    assert not last.get("counted")  # the class's row: not counted unless the rule says so
    # The job goes on at epoch 1, every rank healthy: its progress is written there.
    job = await watch_job(
        node_kube, ns, "act",
        lambda j: (j["status"].get("progress") or {}).get("reporting") == 3
        and (j["status"].get("progress") or {}).get("step", 0) >= 5
        and j["status"]["epoch"] == 1,
        timeout=120, what="training at epoch 1",
    )  # fmt: skip
    assert stragglers(job) is None
    assert job["status"]["restarts"]["total"] == 1
