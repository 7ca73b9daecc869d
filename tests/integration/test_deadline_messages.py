"""`spec.activeDeadlineSeconds` and the failure policy's `onMessagePatterns` on the sim
cluster: the real controller, the real agents (the simulated kubelet of
tests/integration/test_restart.py), failures injected as the kubelet reports them, with the
trainer's termination message in the container's status."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from controller.k8s import GANGJOBS, Invalid, JsonDict, Kube
from tests.integration.harness import gangjob, install_crd, watch_job
from tests.integration.test_restart import Gang, _phase, ctl_kubeconfig, gang
from tests.waiting import wait_for_pods

__all__ = ["ctl_kubeconfig", "gang"]  # the fixtures, shared

pytestmark = pytest.mark.integration

CUDA = "CUDA error: an illegal memory access"
DEADLINE = 20
CRASH_AT = 8
"""Seconds after the start the worker crashes: the deadline, counted from a restart, would
then fall at CRASH_AT + DEADLINE."""


def when(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def failed_condition(job: JsonDict) -> dict[str, str]:
    return dict({c["type"]: c for c in job["status"]["conditions"]}["Failed"])


async def test_the_deadline_fails_the_job_counting_time_spent_restarting(gang: Gang) -> None:
    await gang.create("late", 2, activeDeadlineSeconds=DEADLINE)
    job = await gang.running_at("late", 0, 2)
    await gang.agents_at(0, ["late-0", "late-1"])
    started = when(job["status"]["startTime"])
    await asyncio.sleep(max(0.0, CRASH_AT - (datetime.now(UTC) - started).total_seconds()))
    await gang.sim.crash("late-1", 1)
    await gang.running_at("late", 1, 2)

    job = await watch_job(gang.kube, gang.ns, "late", _phase("Failed"), 60, "Failed")
    st = job["status"]
    failed = failed_condition(job)
    assert failed["reason"] == "DeadlineExceeded"
    assert f"spec.activeDeadlineSeconds ({DEADLINE}s)" in failed["message"]
    assert st["restarts"]["total"] == 1
    # The clock started with the job and went on through the restart: no reset at it.
    ended = when(st["completionTime"])
    assert (ended - started).total_seconds() >= DEADLINE
    detected = when(st["lastRestart"]["detectedAt"])
    assert (ended - detected).total_seconds() < DEADLINE
    # The running workers were stopped in place (cleanPodPolicy None), not deleted: the pass
    # writes the status first, then stops the pods, so the stops may come a moment after it.
    stopped = await wait_for_pods(
        gang.kube, gang.ns,
        lambda ps: sum(p["spec"].get("activeDeadlineSeconds") == 1 for p in ps) == 2,
        30, "both workers stopped in place",
    )  # fmt: skip
    names = [p["metadata"]["name"] for p in stopped if p["spec"].get("activeDeadlineSeconds")]
    assert sorted(names) == ["late-0", "late-1"]


async def test_a_termination_message_rule_fails_the_job(gang: Gang) -> None:
    rules = [{"action": "FailJob", "onMessagePatterns": ["NCCL error", CUDA]}]
    await gang.create("cuda", 2, failurePolicy={"rules": rules})
    await gang.running_at("cuda", 0, 2)
    await gang.agents_at(0, ["cuda-0", "cuda-1"])
    # A message rule that may fail the job takes the trainer's exits out of the kubelet's
    # in-place restart: the pod is left Failed with the message for the controller to read.
    pods = await gang.pods("cuda")
    trainer = pods["cuda-1"]["spec"]["containers"][0]
    assert "restartPolicyRules" not in trainer
    message = f"Traceback ...\nRuntimeError: {CUDA} was encountered\n"
    await gang.sim.crash("cuda-1", 1, message)
    job = await watch_job(gang.kube, gang.ns, "cuda", _phase("Failed"), 30, "Failed")
    failed = failed_condition(job)
    assert failed["reason"] == "FailurePolicy"
    assert "spec.failurePolicy.rules[0] fails the job" in failed["message"]
    assert f"message: RuntimeError: {CUDA} was encountered" in failed["message"]
    assert job["status"]["epoch"] == 0


async def test_a_message_no_rule_matches_restarts_the_gang(gang: Gang) -> None:
    rules = [{"action": "FailJob", "onMessagePatterns": [CUDA]}]
    await gang.create("other", 2, failurePolicy={"rules": rules})
    await gang.running_at("other", 0, 2)
    await gang.agents_at(0, ["other-0", "other-1"])
    await gang.sim.crash("other-1", 1, "ValueError: a bad batch")
    job = await gang.running_at("other", 1, 2)
    last = job["status"]["lastRestart"]
    assert last["trigger"]["class"] == "ProcessExit"
    assert last["trigger"]["detail"].endswith("; message: ValueError: a bad batch")
    assert last["recreated"] == [1]  # its pod Failed: the kubelet restarted nothing in place


@pytest.mark.parametrize(
    "pattern",
    [
        "(?=lookahead)",  # Python only: refused by the subset rule
        "error$",  # read apart: refused by the subset rule
        "(unclosed",  # no RE2: refused because RE2 cannot compile it
    ],
)
async def test_a_pattern_outside_the_subset_is_refused_naming_the_field(
    sim_kube: Kube, namespace: str, pattern: str
) -> None:
    await install_crd(sim_kube)
    rules = [{"action": "FailJob", "onMessagePatterns": [pattern]}]
    with pytest.raises(Invalid) as err:
        await sim_kube.create(
            GANGJOBS, gangjob("bad", 1, failurePolicy={"rules": rules}), namespace
        )
    assert "spec.failurePolicy.rules[0].onMessagePatterns[0]" in str(err.value), err.value
