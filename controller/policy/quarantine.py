"""Node quarantine (docs/design.md section 4.10), pure: nodes that keep failing gangs kept out of
later ones. Opt-in (`--quarantine-nodes`).

Across jobs, the controller counts per node the workers it restarted or moved there for a
failure the node is suspect of (`strikes`): a `Hang` it blamed, a `Straggler` a rule acted on,
a `DeviceUnhealthy`, a crash while the node showed a condition of its own. A node with
`threshold` strikes within `window_seconds` is tainted `gangjob.io/suspect=<class>:NoSchedule`
(an Event on the Node says why) until `until`, kept in the node's annotation
`gangjob.io/suspect-until`, when the controller lifts it (`decide`): its memory is the node,
so a restarted controller lifts it on time.

Never more than `max_share` of the nodes are suspect at once: a detector gone wrong must not
drain the cluster. A node an admin untainted before its expiry stays untainted for the window
(`gangjob.io/suspect-cleared-until`): its strikes then count nothing.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Literal

from api.constants import (
    ANNOTATION_SUSPECT_CLEARED,
    ANNOTATION_SUSPECT_UNTIL,
    REASON_NODE_SUSPECT,
    REASON_NODE_SUSPECT_CLEARED,
    REASON_NODE_SUSPECT_LIFTED,
    TAINT_SUSPECT,
)
from api.failures import FailureClass
from controller.policy.classify import Decision
from controller.policy.views import parse_time

STRIKE_CLASSES: Final = frozenset(
    {FailureClass.HANG, FailureClass.STRAGGLER, FailureClass.DEVICE_UNHEALTHY}
)
"""Failures a node is suspect of when the controller restarts or moves its worker for them."""
CRASH_CLASSES: Final = frozenset({FailureClass.PROCESS_EXIT, FailureClass.OOM_KILLED})
"""Crashes, which strike a node only while it shows a condition of its own (`_node_signal`)."""


@dataclass(frozen=True)
class QuarantineConfig:
    """The controller's `--quarantine-*` flags."""

    threshold: int = 3
    """Strikes within the window that make a node suspect."""
    window_seconds: float = 3600.0
    """How long a strike counts; and how long a node an admin untainted stays untainted."""
    taint_seconds: float = 3600.0
    """How long a suspect node keeps its taint."""
    max_share: float = 0.05
    """At most this share of the cluster's nodes suspect at once (rounded down)."""


@dataclass(frozen=True)
class Strike:
    """A worker restarted or moved on `node` for `failure_class`, at `at`."""

    node: str
    failure_class: FailureClass
    at: datetime
    job: str = ""


def strikes(
    job: str, failures: Sequence[Decision], trigger_worker: int | None, now: datetime
) -> list[Strike]:
    """The strikes of one pass that restarted the gang or moved workers: each worker restarted
    or moved for a class the node is suspect of. A `Hang` strikes only the worker the restart
    names (the others waited for it); a reported-only straggler (`Ignore`) was neither."""
    found = []
    for d in failures:
        node = d.failure.node_name
        if node is None:
            continue
        cls = d.failure_class
        if cls is FailureClass.HANG and d.worker != trigger_worker:
            continue
        if cls in STRIKE_CLASSES or (cls in CRASH_CLASSES and _node_signal(d)):
            found.append(Strike(node, cls, now, job))
    return found


def _node_signal(d: Decision) -> bool:
    """The worker's node showed a condition of its own (pressure, a problem detector's)."""
    return any(t != "Ready" and s == "True" for t, s in d.failure.node_conditions.items())


@dataclass(frozen=True)
class NodeAction:
    """What to do to one node: `taint` (its suspect taint and expiry), `lift` (taint and expiry
    off: it expired), `cleared` (an admin took the taint off: keep it off until `until`),
    `forget` (the admin's window is over: the annotation goes)."""

    node: str
    kind: Literal["taint", "lift", "cleared", "forget"]
    reason: str
    """The Event's reason (none for `forget`)."""
    message: str
    value: str = ""
    """The taint's value: the class of most of the node's strikes."""
    until: datetime | None = None


@dataclass(frozen=True)
class NodeMark:
    """What a node carries of quarantine: our taint (its value), and the annotations."""

    name: str
    taint: str | None
    until: datetime | None
    cleared_until: datetime | None

    @classmethod
    def of(cls, node: Mapping[str, Any]) -> NodeMark:
        meta = node.get("metadata") or {}
        notes = meta.get("annotations") or {}
        taint = next(
            (
                str(t.get("value", ""))
                for t in (node.get("spec") or {}).get("taints") or ()
                if t.get("key") == TAINT_SUSPECT
            ),
            None,
        )
        return cls(
            name=str(meta.get("name", "")),
            taint=taint,
            until=parse_time(notes.get(ANNOTATION_SUSPECT_UNTIL)),
            cleared_until=parse_time(notes.get(ANNOTATION_SUSPECT_CLEARED)),
        )


def decide(
    marks: Iterable[NodeMark], held: Sequence[Strike], now: datetime, config: QuarantineConfig
) -> list[NodeAction]:
    """What to do to the nodes: lift expired taints, remember an admin's untaint, forget it
    once its window is over, and taint the nodes with `threshold` strikes in the window (those
    with most first), never more than `max_share` of the nodes at once."""
    marks = list(marks)
    window = timedelta(seconds=config.window_seconds)
    actions: list[NodeAction] = []
    suspect = 0
    candidates: list[NodeMark] = []
    for m in marks:
        if m.taint is not None:
            # Ours by its key; without its expiry (written by hand?) it is lifted at once.
            if m.until is None or now >= m.until:
                expired = f"at {_stamp(m.until)}" if m.until is not None else "(no expiry)"
                actions.append(
                    NodeAction(
                        m.name,
                        "lift",
                        REASON_NODE_SUSPECT_LIFTED,
                        f"no longer suspect: its taint expired {expired}",
                    )
                )
            else:
                suspect += 1
        elif m.until is not None:
            until = now + window
            actions.append(
                NodeAction(
                    m.name,
                    "cleared",
                    REASON_NODE_SUSPECT_CLEARED,
                    f"taint {TAINT_SUSPECT} taken off before it expired: not tainted again "
                    f"until {_stamp(until)}",
                    until=until,
                )
            )
        elif m.cleared_until is not None:
            if now >= m.cleared_until:
                actions.append(NodeAction(m.name, "forget", "", ""))
        elif m.taint is None:
            candidates.append(m)
    cap = math.floor(config.max_share * len(marks))
    counts = _counts(held, now - window)
    ranked = sorted(
        (m for m in candidates if sum(counts.get(m.name, Counter()).values()) >= config.threshold),
        key=lambda m: (-sum(counts[m.name].values()), m.name),
    )
    for m in ranked:
        if suspect >= cap:
            break
        by_class = counts[m.name]
        value = by_class.most_common(1)[0][0]
        until = now + timedelta(seconds=config.taint_seconds)
        what = ", ".join(f"{n} {cls}" for cls, n in sorted(by_class.items()))
        actions.append(
            NodeAction(
                m.name,
                "taint",
                REASON_NODE_SUSPECT,
                f"{sum(by_class.values())} workers restarted or moved off this node within "
                f"{config.window_seconds:g}s ({what}): tainted {TAINT_SUSPECT}={value}:"
                f"NoSchedule until {_stamp(until)}",
                value=value,
                until=until,
            )
        )
        suspect += 1
    return actions


def _counts(held: Sequence[Strike], since: datetime) -> dict[str, Counter[str]]:
    counts: dict[str, Counter[str]] = {}
    for s in held:
        if s.at >= since:
            counts.setdefault(s.node, Counter())[str(s.failure_class)] += 1
    return counts


class Ledger:
    """The strikes the controller holds (in memory: a restarted controller starts counting
    afresh, which can only quarantine later), and what they make of the nodes."""

    def __init__(self, config: QuarantineConfig) -> None:
        self.config = config
        self.held: list[Strike] = []

    def add(self, found: Iterable[Strike]) -> None:
        self.held.extend(found)

    def decide(self, marks: Iterable[NodeMark], now: datetime) -> list[NodeAction]:
        """`decide` over the strikes in the window. A node tainted, or whose taint an admin
        took off, starts from no strike: what made it suspect is paid for."""
        since = now - timedelta(seconds=self.config.window_seconds)
        marks = list(marks)
        actions = decide(marks, self.held, now, self.config)
        spent = {a.node for a in actions if a.kind in ("taint", "cleared")}
        spent |= {m.name for m in marks if m.taint is not None or m.cleared_until is not None}
        self.held = [s for s in self.held if s.at >= since and s.node not in spent]
        return actions


def _stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")
