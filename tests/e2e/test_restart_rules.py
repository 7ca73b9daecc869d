"""The real kubelet applies container restart rules: KEP-5307 Restart and KEP-5532
RestartAllContainers restart containers in place (same pod UID, same emptyDir)."""

from __future__ import annotations

from typing import Any

import pytest

from controller.k8s import PODS, Kube
from tests.waiting import wait_for

pytestmark = pytest.mark.e2e

BUSYBOX = "localhost/busybox:dev"
# Exits 42 the first time (leaving a mark in the shared emptyDir), runs the second time.
EXIT_ONCE = "if [ -f /data/once ]; then exec sleep 3600; else touch /data/once; exit 42; fi"


def statuses(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    s = pod.get("status", {})
    return {
        c["name"]: c for c in s.get("containerStatuses", []) + s.get("initContainerStatuses", [])
    }


def restarted_and_running(pod: dict[str, Any], name: str) -> bool:
    c = statuses(pod).get(name, {})
    return c.get("restartCount", 0) >= 1 and "running" in c.get("state", {})


async def test_restart_rule_restarts_the_container_in_place(
    node_kube: Kube, node_namespace: str
) -> None:
    pod = {
        "metadata": {"name": "exit-once"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "trainer",
                    "image": BUSYBOX,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", EXIT_ONCE],
                    "restartPolicy": "Never",
                    "restartPolicyRules": [
                        {"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}
                    ],
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                }
            ],
            "volumes": [{"name": "data", "emptyDir": {}}],
            "terminationGracePeriodSeconds": 1,
        },
    }
    created = await node_kube.create(PODS, pod, node_namespace)
    # The apiserver keeps the rules (it drops them silently when the gate is off).
    assert created["spec"]["containers"][0]["restartPolicyRules"]
    got = await wait_for(
        node_kube,
        PODS,
        "exit-once",
        node_namespace,
        lambda p: restarted_and_running(p, "trainer"),
        timeout=60,
        what="restarted once and running",
    )
    trainer = statuses(got)["trainer"]
    assert trainer["restartCount"] == 1
    assert trainer["lastState"]["terminated"]["exitCode"] == 42
    assert got["metadata"]["uid"] == created["metadata"]["uid"]
    assert got["status"]["phase"] == "Running"


async def test_restart_all_containers_rule_restarts_the_whole_pod_in_place(
    node_kube: Kube, node_namespace: str
) -> None:
    pod = {
        "metadata": {"name": "restart-all"},
        "spec": {
            "restartPolicy": "Never",
            "initContainers": [
                {
                    "name": "init",
                    "image": BUSYBOX,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "echo init >> /data/inits"],
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                }
            ],
            "containers": [
                {
                    "name": "trainer",
                    "image": BUSYBOX,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", EXIT_ONCE],
                    "restartPolicy": "Never",
                    "restartPolicyRules": [
                        {
                            "action": "RestartAllContainers",
                            "exitCodes": {"operator": "In", "values": [42]},
                        }
                    ],
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                },
                {
                    "name": "sidecar",
                    "image": BUSYBOX,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"],
                },
            ],
            "volumes": [{"name": "data", "emptyDir": {}}],
            "terminationGracePeriodSeconds": 2,
        },
    }
    created = await node_kube.create(PODS, pod, node_namespace)
    assert created["spec"]["containers"][0]["restartPolicyRules"][0]["action"] == (
        "RestartAllContainers"
    )

    def all_restarted(p: dict[str, Any]) -> bool:
        return (
            p.get("status", {}).get("phase") == "Running"
            and all(restarted_and_running(p, n) for n in ("trainer", "sidecar"))
            and statuses(p).get("init", {}).get("restartCount", 0) >= 1
        )

    got = await wait_for(
        node_kube, PODS, "restart-all", node_namespace, all_restarted, timeout=90,
        what="restarted as a whole and running",
    )  # fmt: skip
    assert got["metadata"]["uid"] == created["metadata"]["uid"]
    st = statuses(got)
    # Every container, the init container included, ran again exactly once ...
    assert {n: st[n]["restartCount"] for n in ("init", "trainer", "sidecar")} == {
        "init": 1,
        "trainer": 1,
        "sidecar": 1,
    }
    # ... and the kubelet records the synthetic reason, not the real exit (docs/localcluster.md).
    assert st["sidecar"]["lastState"]["terminated"]["reason"] == "RestartingAllContainers"
    # Same sandbox: the emptyDir survived the restart, so the trainer found its mark and kept
    # running (with a fresh volume it would exit 42 again and count a second restart).
    assert st["trainer"]["restartCount"] == 1
    assert "running" in st["trainer"]["state"]
