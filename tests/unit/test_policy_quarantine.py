"""Node quarantine (controller/policy/quarantine.py): which restarts strike a node, the
threshold within the window, the taint's expiry kept on the node, the share cap, and an admin's
untaint respected for the window."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from api.failures import FailureClass
from api.v1alpha1 import FailureAction
from controller.policy.classify import Decision, Failure
from controller.policy.quarantine import (
    Ledger,
    NodeMark,
    QuarantineConfig,
    Strike,
    decide,
    strikes,
)

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
CONFIG = QuarantineConfig(threshold=3, window_seconds=600, taint_seconds=300, max_share=0.5)


def node(name: str, taint: str | None = None, **annotations: str) -> dict[str, Any]:
    taints = [{"key": "gangjob.io/suspect", "value": taint, "effect": "NoSchedule"}]
    return {
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"taints": taints if taint is not None else []},
    }


def marks(*nodes: dict[str, Any]) -> list[NodeMark]:
    return [NodeMark.of(n) for n in nodes]


def hits(
    node_name: str, n: int, cls: FailureClass = FailureClass.STRAGGLER, ago: float = 10.0
) -> list[Strike]:
    return [Strike(node_name, cls, NOW - timedelta(seconds=ago), "ns/j") for _ in range(n)]


def decision(
    worker: int, cls: FailureClass, node: str | None = "n1", **conditions: str
) -> Decision:
    failure = Failure(worker, cls, "x", node_name=node, node_conditions=conditions)
    return Decision(failure, FailureAction.RECREATE_WORKER, counted=False)


def test_the_restarts_a_node_is_suspect_of_strike_it() -> None:
    found = strikes(
        "ns/j",
        [
            decision(0, FailureClass.STRAGGLER, "n1"),
            decision(1, FailureClass.DEVICE_UNHEALTHY, "n2"),
            decision(2, FailureClass.HANG, "n3"),  # the hung one, named by the restart
            decision(3, FailureClass.HANG, "n4"),  # waited for it
            decision(4, FailureClass.PROCESS_EXIT, "n5"),  # a crash on a quiet node
            decision(5, FailureClass.OOM_KILLED, "n6", MemoryPressure="True", Ready="True"),
            decision(6, FailureClass.NODE_LOST, "n7"),  # the node is gone: nothing to keep out
            decision(7, FailureClass.STRAGGLER, None),
        ],
        trigger_worker=2,
        now=NOW,
    )
    assert [(s.node, s.failure_class) for s in found] == [
        ("n1", "Straggler"),
        ("n2", "DeviceUnhealthy"),
        ("n3", "Hang"),
        ("n6", "OOMKilled"),
    ]


def test_a_node_past_the_threshold_within_the_window_is_tainted_until_its_expiry() -> None:
    held = hits("n1", 2) + hits("n1", 1, FailureClass.HANG) + hits("n2", 2)
    held += hits("n3", 3, ago=700)  # out of the window
    [action] = decide(marks(node("n1"), node("n2"), node("n3"), node("n4")), held, NOW, CONFIG)
    assert (action.node, action.kind, action.value) == ("n1", "taint", "Straggler")
    assert action.until == NOW + timedelta(seconds=300)
    assert action.reason == "NodeSuspect"
    assert "3 workers restarted or moved off this node within 600s (1 Hang, 2 Straggler)" in (
        action.message
    )


def test_never_more_than_the_share_of_nodes_at_once() -> None:
    until = (NOW + timedelta(seconds=100)).strftime("%Y-%m-%dT%H:%M:%SZ")
    held = hits("n2", 3) + hits("n3", 5)
    nodes = marks(
        node("n1", "Hang", **{"gangjob.io/suspect-until": until}),
        node("n2"),
        node("n3"),
        node("n4"),
    )
    # Half of 4 nodes: n1 is suspect already, room for one more: the one with most strikes.
    actions = decide(nodes, held, NOW, CONFIG)
    assert [(a.node, a.kind) for a in actions] == [("n3", "taint")]
    tight = QuarantineConfig(threshold=3, window_seconds=600, taint_seconds=300, max_share=0.2)
    assert decide(nodes, held, NOW, tight) == []  # 0.8 of a node, rounded down


def test_an_expired_taint_is_lifted() -> None:
    past = (NOW - timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    [action] = decide(
        marks(node("n1", "Straggler", **{"gangjob.io/suspect-until": past})), [], NOW, CONFIG
    )
    assert (action.node, action.kind, action.reason) == ("n1", "lift", "NodeSuspectLifted")
    # Ours without an expiry (written by hand): lifted too.
    [action] = decide(marks(node("n1", "Straggler")), [], NOW, CONFIG)
    assert action.kind == "lift"


def test_an_admins_untaint_is_respected_for_the_window() -> None:
    until = (NOW + timedelta(seconds=200)).strftime("%Y-%m-%dT%H:%M:%SZ")
    # The taint is gone, its expiry still there: an admin took it off.
    untainted = node("n1", **{"gangjob.io/suspect-until": until})
    [action] = decide(marks(untainted, node("n2")), hits("n1", 5), NOW, CONFIG)
    assert (action.kind, action.reason) == ("cleared", "NodeSuspectCleared")
    assert action.until == NOW + timedelta(seconds=600)
    # Then, marked cleared: its strikes count nothing until the window is over ...
    stamp = action.until.strftime("%Y-%m-%dT%H:%M:%SZ")
    cleared = node("n1", **{"gangjob.io/suspect-cleared-until": stamp})
    assert decide(marks(cleared, node("n2")), hits("n1", 5), NOW, CONFIG) == []
    # ... and after it the mark goes, and the node is judged afresh.
    later = NOW + timedelta(seconds=601)
    [action] = decide(marks(cleared, node("n2")), [], later, CONFIG)
    assert (action.node, action.kind) == ("n1", "forget")


def test_the_ledger_forgets_what_a_taint_paid_for_and_what_the_window_left() -> None:
    ledger = Ledger(CONFIG)
    ledger.add(hits("n1", 3) + hits("n2", 1) + hits("n2", 1, ago=700))
    [action] = ledger.decide(marks(node("n1"), node("n2")), NOW)
    assert action.node == "n1"
    # The taint paid for n1's strikes: once it is lifted, n1 starts from none.
    assert [s.node for s in ledger.held] == ["n2"]
