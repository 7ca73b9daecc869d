"""Node quarantine, carried out (docs/design.md section 4.10): with `--quarantine-nodes`, the
strikes the reconciler records from the restarts it stored (`Quarantine.record`), and, while
this replica leads, a loop that applies `controller.policy.quarantine`'s decisions to the
Nodes: the suspect taint and its expiry put on, lifted, an admin's untaint remembered; each with
an Event on the Node. Its RBAC (`patch` on nodes) is granted only with the option.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Callable
from typing import Any, Final

from api.constants import (
    ANNOTATION_SUSPECT_CLEARED,
    ANNOTATION_SUSPECT_UNTIL,
    TAINT_SUSPECT,
)
from controller.k8s import CORE_EVENTS, NODES, Conflict, JsonDict, Kube, NotFound
from controller.k8s.store import Store
from controller.policy.passstate import Plan
from controller.policy.quarantine import (
    Ledger,
    NodeAction,
    NodeMark,
    QuarantineConfig,
    strikes,
)

log = logging.getLogger(__name__)

QUARANTINE_PERIOD: Final = 5.0
"""How often the nodes are looked at with no new strike (an expiry comes due)."""
EVENT_NAMESPACE: Final = "default"
"""Where the Events of a Node (cluster-scoped) go, as the kubelet's do."""
REPORTING_COMPONENT: Final = "gangjob-controller"


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _stamp(at: dt.datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


class Quarantine:
    """The strikes of this controller's restarts, and the loop that quarantines nodes."""

    def __init__(
        self,
        kube: Kube,
        nodes: Store,
        config: QuarantineConfig,
        *,
        identity: str = REPORTING_COMPONENT,
        now: Callable[[], dt.datetime] = utcnow,
    ) -> None:
        self.kube = kube
        self.nodes = nodes
        self.ledger = Ledger(config)
        self.identity = identity
        self.now = now
        self._wake = asyncio.Event()

    def record(self, job: str, decided: Plan) -> None:
        """A pass of GangJob `job` (namespace/name) stored its restart or moved workers: the
        nodes it struck."""
        trigger = decided.restart_started.trigger.worker if decided.restart_started else None
        found = strikes(job, decided.failures, trigger, self.now())
        if found:
            self.ledger.add(found)
            self._wake.set()

    async def run(self) -> None:
        """While this replica leads: the nodes looked at every `QUARANTINE_PERIOD`, and at
        once on a new strike."""
        while True:
            try:
                await self.once()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the apiserver away: the next round tries again
                log.warning("node quarantine: %s", e)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), QUARANTINE_PERIOD)
            self._wake.clear()

    async def once(self) -> list[NodeAction]:
        """One round: the decisions over the cached nodes, applied."""
        nodes = {str(n["metadata"]["name"]): n for n in self.nodes.list()}
        actions = self.ledger.decide((NodeMark.of(n) for n in nodes.values()), self.now())
        for action in actions:
            node = nodes[action.node]
            try:
                await self._apply(action, node)
            except (Conflict, NotFound) as e:  # it changed under us: the next round sees it
                log.info("node %s not %s: %s", action.node, action.kind, e)
                continue
            if action.reason:
                log.info("node %s: %s", action.node, action.message)
                await self._event(node, action)
        return actions

    async def _apply(self, action: NodeAction, node: JsonDict) -> None:
        """One merge patch, conditional on the node's resourceVersion (the taints are one list:
        a taint added meanwhile is never dropped)."""
        taints = [
            t for t in (node.get("spec") or {}).get("taints") or () if t.get("key") != TAINT_SUSPECT
        ]
        annotations: dict[str, Any] = {}
        spec: dict[str, Any] | None = None
        if action.kind == "taint":
            assert action.until is not None
            spec = {
                "taints": [
                    *taints,
                    {"key": TAINT_SUSPECT, "value": action.value, "effect": "NoSchedule"},
                ]
            }
            annotations = {
                ANNOTATION_SUSPECT_UNTIL: _stamp(action.until),
                ANNOTATION_SUSPECT_CLEARED: None,
            }
        elif action.kind == "lift":
            spec = {"taints": taints}
            annotations = {ANNOTATION_SUSPECT_UNTIL: None}
        elif action.kind == "cleared":
            assert action.until is not None
            annotations = {
                ANNOTATION_SUSPECT_UNTIL: None,
                ANNOTATION_SUSPECT_CLEARED: _stamp(action.until),
            }
        else:
            annotations = {ANNOTATION_SUSPECT_CLEARED: None}
        meta = node.get("metadata") or {}
        body: JsonDict = {
            "metadata": {"resourceVersion": meta.get("resourceVersion"), "annotations": annotations}
        }
        if spec is not None:
            body["spec"] = spec
        await self.kube.patch(NODES, action.node, body)

    async def _event(self, node: JsonDict, action: NodeAction) -> None:
        meta = node.get("metadata") or {}
        stamp = _stamp(self.now())
        body = {
            "metadata": {"generateName": f"{action.node}.", "namespace": EVENT_NAMESPACE},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Node",
                "name": action.node,
                "uid": meta.get("uid"),
            },
            "type": "Warning" if action.kind == "taint" else "Normal",
            "reason": action.reason,
            "message": action.message,
            "source": {"component": REPORTING_COMPONENT},
            "reportingComponent": REPORTING_COMPONENT,
            "reportingInstance": self.identity,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            await self.kube.create(CORE_EVENTS, body, EVENT_NAMESPACE)
        except Exception as e:  # best effort, as every Event
            log.warning("event %s for node %s not recorded: %s", action.reason, action.node, e)
