"""A hung worker on a real kubelet: a trainer that stops reporting progress, alive, is restarted
in place as a `Hang` naming it, hangSeconds after its last step; one that never reports is never
restarted; malformed progress lines are ignored and counted (docs/design.md section 4.7)."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

import pytest

from api import builders
from controller.k8s import GANGJOBS, JsonDict, Kube
from localcluster.node import AGENT_IMAGE
from localcluster.tools import ControllerProcess
from tests.integration.harness import gang_pods, watch_job

pytestmark = pytest.mark.e2e

HANG_SECONDS = 5

# Every trainer reports a step a second, as a shell loop can, and the gang's one checkpoint, of
# step 3, once there (a checkpoint is the gang's: the step it resumes from): rank 1 stops
# reporting after step 5 at epoch 0 but stays alive (as a wedged device leaves a trainer),
# rank 2 never reports at all, and rank 0 follows each step from its second with a malformed
# line (every step: the file is replaced each second and the agent polls each second, so a line
# written once can be replaced before any poll reads it).
TRAINER = r"""
trap 'exit 0' TERM
epoch=${GANGJOB_EPOCH:-$(cat "$GANGJOB_DIR/epoch")}
i=0
while :; do
  i=$((i+1))
  line="step=$i"
  if [ "$i" -ge 3 ]; then line="$line checkpoint=3"; fi
  case "$RANK:$epoch" in
    2:*) ;;
    1:0) if [ "$i" -le 5 ]; then echo "$line" > "$GANGJOB_PROGRESS"; fi ;;
    0:*) echo "$line" > "$GANGJOB_PROGRESS"
         if [ "$i" -ge 2 ]; then echo "step=two" >> "$GANGJOB_PROGRESS"; fi ;;
    *) echo "$line" > "$GANGJOB_PROGRESS" ;;
  esac
  echo "epoch=$epoch rank=$RANK step=$i"
  sleep 1
done
"""


def gangjob(name: str, mode: str) -> JsonDict:
    # Process mode runs the agent inside the trainer's container: that image needs python3.
    image = AGENT_IMAGE if mode == "Process" else "localhost/busybox:dev"
    return builders.gangjob(
        name, 3,
        image=image, command=["sh", "-c", TRAINER],
        container={"imagePullPolicy": "Never"},
        pod_spec={"terminationGracePeriodSeconds": 5},
        restart_mode=mode,
        spec={"progress": {"hangSeconds": HANG_SECONDS}},
    )  # fmt: skip


def running_at(epoch: int) -> Any:
    def check(job: JsonDict) -> bool:
        st = job.get("status", {})
        return bool(st.get("epoch") == epoch and st.get("barrierEpoch") == epoch)

    return check


async def test_a_worker_that_stops_reporting_restarts_the_gang_in_place_as_a_hang(
    node_kube: Kube, node_namespace: str, controller: ControllerProcess
) -> None:
    """One gang per restart mode, side by side (each waits out the same steps)."""
    ns = node_namespace
    for name, mode in GANGS.items():
        await node_kube.create(GANGJOBS, gangjob(name, mode), ns)
    await asyncio.gather(*(_restarts_in_place_as_a_hang(node_kube, ns, name) for name in GANGS))


GANGS = {"hang-pod": "Pod", "hang-process": "Process"}


async def _restarts_in_place_as_a_hang(node_kube: Kube, ns: str, name: str) -> None:
    job = await watch_job(node_kube, ns, name, running_at(0), timeout=120, what="running")
    before = uids(await gang_pods(node_kube, ns, name))
    job = await watch_job(node_kube, ns, name, running_at(1), timeout=90, what="at epoch 1")
    last = job["status"]["lastRestart"]
    assert last["trigger"]["class"] == "Hang", last
    assert last["trigger"]["worker"] == 1, last  # the hung one, not a rank that waited
    assert "no step past 5" in last["trigger"]["detail"], last
    assert last["recreated"] == []
    assert last["counted"] is True
    # Detected hangSeconds (and the settling second) after its last step, not minutes later.
    detected = seconds(last["detectedAt"]) - seconds(last["onsetAt"])
    assert HANG_SECONDS <= detected < HANG_SECONDS + 10, last
    # What it lost: the gang was at rank 1's step 5, its common checkpoint at step 3.
    assert (last["step"], last["checkpointStep"], last["lostSteps"]) == (5, 3, 2), last
    assert uids(await gang_pods(node_kube, ns, name)) == before  # in place: the same pods
    # Rank 2 never reported and rank 1 reports again: no more restarts. Rank 0's malformed lines
    # of this epoch are counted once its summary comes in, and both ranks are counted once both
    # summaries are in (the epoch's first summary is written at once, whichever rank sent it;
    # the rest at most 30 s later).
    job = await watch_job(
        node_kube, ns, name,
        lambda j: (j["status"].get("progress") or {}).get("malformedLines", 0) >= 1
        and (j["status"].get("progress") or {}).get("reporting", 0) >= 2
        and j["status"]["epoch"] == 1,
        timeout=120, what="the malformed line and both reporting ranks counted at epoch 1",
    )  # fmt: skip
    progress = job["status"]["progress"]
    assert progress["reporting"] == 2, progress  # ranks 0 and 1; rank 2 never reports
    assert job["status"]["restarts"]["total"] == 1
    goodput = job["status"]["goodput"]
    assert 0 < goodput["ratio"] < 1, goodput
    assert goodput["lostSeconds"]["detection"] >= HANG_SECONDS, goodput


def uids(pods: list[JsonDict]) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}


def seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
