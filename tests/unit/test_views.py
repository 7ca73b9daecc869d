"""Unit tests of controller.policy.views: parsing Pods and Nodes as the apiserver returns them."""

import dataclasses
import functools
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.policy import views
from controller.policy.views import (
    ContainerView,
    NodeView,
    PodView,
    parse_decimal_int,
    parse_exit_report,
    parse_quantity,
    parse_resources,
)

JOB_UID = "0b6d2c55-6f7e-4a39-9a53-5a0e8f4c1d2e"

# A worker pod after a KEP-5532 restart, with a device reported unhealthy (KEP-4680).
POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "llama-3",
        "namespace": "ml",
        "uid": "pod-uid-3",
        "resourceVersion": "812",
        "creationTimestamp": "2026-05-01T10:00:00Z",
        "deletionTimestamp": "2026-05-01T10:05:00Z",
        "labels": {"gangjob.io/name": "llama", "gangjob.io/rank": "3", "team": "ml"},
        "annotations": {
            "gangjob.io/epoch": "2",
            "gangjob.io/created-epoch": "1",
            "gangjob.io/exit": "1:137",
        },
        "ownerReferences": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "not-controller"},
            {
                "apiVersion": "gangjob.io/v1alpha1",
                "kind": "GangJob",
                "name": "llama",
                "uid": JOB_UID,
                "controller": True,
                "blockOwnerDeletion": True,
            },
        ],
    },
    "spec": {"nodeName": "node-7", "containers": [{"name": "trainer", "image": "t:1"}]},
    "status": {
        "phase": "Running",
        "conditions": [
            {"type": "Initialized", "status": "True"},
            {"type": "Ready", "status": "True"},
            {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"},
        ],
        "initContainerStatuses": [
            {
                "name": "agent",
                "restartCount": 2,
                "ready": True,
                "started": True,
                "state": {"running": {"startedAt": "2026-05-01T10:01:00Z"}},
            }
        ],
        "containerStatuses": [
            {
                "name": "trainer",
                "restartCount": 2,
                "ready": False,
                "started": False,
                "state": {"terminated": {"exitCode": 3, "reason": "Error"}},
                "lastState": {"terminated": {"exitCode": 137, "reason": "RestartingAllContainers"}},
                "allocatedResourcesStatus": [
                    {
                        "name": "nvidia.com/gpu",
                        "resources": [
                            {"resourceID": "gpu-0", "health": "Healthy"},
                            {"resourceID": "gpu-1", "health": "Unhealthy"},
                        ],
                    },
                    {
                        "name": "example.com/nic",
                        "resources": [{"resourceID": "n", "health": "Unknown"}],
                    },
                ],
            },
            {
                "name": "logger",
                "restartCount": 0,
                "ready": True,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            },
        ],
    },
}


def test_pod_view_parses_every_field() -> None:
    view = PodView.from_pod(POD)
    assert view.name == "llama-3"
    assert view.namespace == "ml"
    assert view.uid == "pod-uid-3"
    assert view.rank == 3
    assert view.phase == "Running"
    assert view.node_name == "node-7"
    assert view.creation_timestamp == datetime(2026, 5, 1, 10, 0, tzinfo=UTC)
    assert view.deletion_timestamp == datetime(2026, 5, 1, 10, 5, tzinfo=UTC)
    assert view.terminating
    assert view.labels["team"] == "ml"
    assert view.controller_uid == JOB_UID
    assert view.arrived_epoch == 2
    assert view.created_epoch == 1
    assert view.reported_exit == (1, 137)
    assert view.ready
    assert view.conditions == {
        "Initialized": ("True", None),
        "Ready": ("True", None),
        "DisruptionTarget": ("True", "EvictionByEvictionAPI"),
    }
    assert view.init_containers == (
        ContainerView(name="agent", restart_count=2, ready=True, started=True, state="running"),
    )
    assert view.container("trainer") == ContainerView(
        name="trainer",
        restart_count=2,
        ready=False,
        started=False,
        state="terminated",
        exit_code=3,
        reason="Error",
        last_exit_code=137,
        last_reason="RestartingAllContainers",
        unhealthy_resources=("nvidia.com/gpu",),
        unknown_health_resources=("example.com/nic",),
    )
    logger = view.container("logger")
    assert logger is not None
    assert (logger.state, logger.reason, logger.started) == ("waiting", "CrashLoopBackOff", None)
    assert view.container("missing") is None


def test_pod_view_reads_termination_times_requests_rules_and_mode() -> None:
    pod: dict[str, Any] = {
        "metadata": {"name": "llama-0", "annotations": {"gangjob.io/restart-mode": "Pod"}},
        "spec": {
            "initContainers": [
                {
                    "name": "gangjob-agent",
                    "restartPolicy": "Always",
                    "restartPolicyRules": [{"action": "RestartAllContainers"}],
                    "resources": {"requests": {"cpu": "100m"}},
                }
            ],
            "containers": [
                {
                    "name": "trainer",
                    "resources": {
                        "requests": {"memory": "1Gi", "example.com/nic": "1"},
                        "limits": {"nvidia.com/gpu": "8", "kubernetes.io/bandwidth": "1"},
                    },
                }
            ],
        },
        "status": {
            "containerStatuses": [
                {
                    "name": "trainer",
                    "state": {"terminated": {"exitCode": 1, "finishedAt": "2026-05-01T10:03:00Z"}},
                    "lastState": {
                        "terminated": {"exitCode": 137, "finishedAt": "2026-05-01T10:02:00Z"}
                    },
                }
            ]
        },
    }
    view = PodView.from_pod(pod)
    assert view.requested_resources == {"nvidia.com/gpu", "example.com/nic"}
    assert view.has_restart_rules
    assert view.restart_mode == "Pod"
    trainer = view.container("trainer")
    assert trainer is not None
    assert trainer.finished_at == datetime(2026, 5, 1, 10, 3, tzinfo=UTC)
    assert trainer.last_finished_at == datetime(2026, 5, 1, 10, 2, tzinfo=UTC)
    pod["spec"]["initContainers"][0]["restartPolicyRules"] = []
    assert not PodView.from_pod(pod).has_restart_rules


def test_a_pod_view_evolves_as_replace_would_keeping_its_container_lookups() -> None:
    view = PodView.from_pod(POD)
    assert view.unsettled_containers is not None  # cached now
    before = (view._by_name, view.all_containers, view.unsettled_containers)
    new = view.evolve(arrived_epoch=5, reported_exit=(5, None), restarted=True)
    assert new == dataclasses.replace(view, arrived_epoch=5, reported_exit=(5, None),
                                      restarted=True)  # fmt: skip
    assert (new.arrived_epoch, view.arrived_epoch) == (5, 2)  # the old view is unchanged
    # Its containers the same: the lookups are the old view's (no walk again).
    assert (new._by_name, new.all_containers, new.unsettled_containers) == before
    assert new._by_name is before[0]
    # Its containers changed: walked anew.
    none = view.evolve(containers=(), init_containers=())
    assert (none.container("trainer"), none.all_containers, none.unsettled_containers) == (
        None,
        (),
        (),
    )
    with pytest.raises(TypeError, match="no field 'epoch'"):
        view.evolve(epoch=1)
    # Every cached property is one of the containers' (else `evolve` would carry it stale).
    cached = {n for n, a in vars(PodView).items() if isinstance(a, functools.cached_property)}
    assert cached == set(views._CACHED_OF_CONTAINERS)


def test_pod_view_of_a_pod_just_created() -> None:
    """What the apiserver returns right after a create: no status beyond the phase."""
    view = PodView.from_pod(
        {
            "metadata": {"name": "llama-0", "namespace": "ml", "uid": "u0"},
            "spec": {},
            "status": {"phase": "Pending", "qosClass": "BestEffort"},
        }
    )
    assert view.rank is None
    assert view.phase == "Pending"
    assert view.node_name is None
    assert view.deletion_timestamp is None
    assert not view.terminating
    assert view.controller_uid is None
    assert (view.arrived_epoch, view.created_epoch, view.reported_exit) == (None, None, None)
    assert not view.ready
    assert view.conditions == {}
    assert view.containers == view.init_containers == ()


def test_pod_view_tolerates_garbage() -> None:
    view = PodView.from_pod(
        {
            "metadata": {
                "name": "x",
                "labels": {"gangjob.io/rank": "-1"},
                "annotations": {"gangjob.io/epoch": "two"},
                "deletionTimestamp": "yesterday",
                "ownerReferences": "nope",
            },
            "status": {"conditions": [None, {"type": "Ready"}], "containerStatuses": [{}]},
        }
    )
    assert view.rank is None
    assert view.arrived_epoch is None
    assert view.deletion_timestamp is None
    assert view.conditions == {}
    assert view.containers == (ContainerView(name=""),)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("17", 17),
        ("007", 7),
        ("-1", None),
        ("+1", None),
        (" 1", None),
        ("1_000", None),
        ("1.0", None),
        ("", None),
        ("٣", None),  # a non-ASCII digit: str.isdigit says yes, the protocol says no
        (None, None),
        (3, None),
    ],
)
def test_parse_decimal_int(text: object, expected: int | None) -> None:
    assert parse_decimal_int(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("3:1", (3, 1)),
        ("0:0", (0, 0)),
        ("12:255", (12, 255)),
        ("4:-1", (4, None)),  # a Pod-mode agent's report: restarted at 4, code unknown
        ("4:-2", None),
        ("3", None),
        ("3:", None),
        (":1", None),
        ("3:1:2", None),
        ("a:b", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_exit_report(text: str | None, expected: tuple[int, int | None] | None) -> None:
    assert parse_exit_report(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8", Decimal(8)),
        ("500m", Decimal("0.5")),
        ("3500m", Decimal("3.5")),
        ("2k", Decimal(2000)),
        ("1Ki", Decimal(1024)),
        ("16Gi", Decimal(16 * 1024**3)),
        ("1e3", Decimal(1000)),
        ("1E", Decimal(10**18)),
        ("1.5", Decimal("1.5")),
        ("100n", Decimal("1E-7")),
        ("", None),
        ("ten", None),
        ("1KiB", None),
    ],
)
def test_parse_quantity(text: str, expected: Decimal | None) -> None:
    assert parse_quantity(text) == expected


def test_parse_resources_counts_cpu_pods_and_devices_only() -> None:
    assert parse_resources(
        {
            "cpu": "4",
            "pods": "110",
            "nvidia.com/gpu": "8",
            "example.com/foo": "1k",
            "memory": "16Gi",
            "ephemeral-storage": "100Gi",
            "hugepages-2Mi": "0",
        }
    ) == {
        "cpu": 4,
        "pods": 110,
        "nvidia.com/gpu": 8,
        "example.com/foo": 1000,
        "memory": "16Gi",
        "ephemeral-storage": "100Gi",
        "hugepages-2Mi": "0",
    }
    # A fractional cpu is not a count: it stays as written rather than being rounded.
    assert parse_resources({"cpu": "3500m"}) == {"cpu": "3500m"}


@given(st.integers(min_value=0, max_value=10**6))
def test_parse_resources_round_trips_integer_devices(count: int) -> None:
    assert parse_resources({"nvidia.com/gpu": str(count)}) == {"nvidia.com/gpu": count}


NODE: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {"name": "node-7", "annotations": {"kwok.x-k8s.io/node": "fake"}},
    "spec": {
        "unschedulable": True,
        "taints": [
            {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
            {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"},
        ],
    },
    "status": {
        "conditions": [
            {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"},
            {"type": "GpuXidError", "status": "True"},
        ],
        "allocatable": {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": "7", "pods": "110"},
        "capacity": {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": "8", "pods": "110"},
        "declaredFeatures": ["RestartAllContainersOnContainerExits"],
    },
}


def test_node_view_parses_every_field() -> None:
    view = NodeView.from_node(NODE)
    assert view.name == "node-7"
    assert view.ready == "Unknown"
    assert view.taints == (
        ("node.kubernetes.io/unreachable", "NoExecute"),
        ("node.kubernetes.io/unreachable", "NoSchedule"),
    )
    assert view.has_taint("node.kubernetes.io/unreachable")
    assert view.has_taint("node.kubernetes.io/unreachable", "NoExecute")
    assert not view.has_taint("node.kubernetes.io/out-of-service")
    assert view.conditions == {"Ready": "Unknown", "GpuXidError": "True"}
    assert view.allocatable["nvidia.com/gpu"] == 7
    assert view.capacity["nvidia.com/gpu"] == 8
    assert view.capacity["memory"] == "256Gi"
    assert view.declared_features == frozenset({"RestartAllContainersOnContainerExits"})
    assert view.unschedulable


@pytest.mark.parametrize(
    ("conditions", "ready"),
    [
        ([{"type": "Ready", "status": "True"}], "True"),
        ([{"type": "Ready", "status": "False"}], "False"),
        ([{"type": "Ready", "status": "Unknown"}], "Unknown"),
        ([{"type": "Ready", "status": "Maybe"}], "Unknown"),
        ([], "Unreported"),  # none yet: just registered
    ],
)
def test_node_ready(conditions: list[dict[str, str]], ready: str) -> None:
    view = NodeView.from_node({"metadata": {"name": "n"}, "status": {"conditions": conditions}})
    assert view.ready == ready
    assert view.taints == ()
    assert not view.unschedulable
    assert view.declared_features == frozenset()
