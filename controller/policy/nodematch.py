"""Which nodes a pod template may land on, as far as node labels and names decide it: the
template's `nodeSelector` and its required node affinity, read the way the scheduler reads them
(k8s.io/component-helpers/scheduling/corev1/nodeaffinity). Pure.

`plan` asks this when it chooses a restart mode: in a mixed cluster only the nodes the workers
may run on say whether `Pod` mode (KEP-5532) can be scheduled. Taints, resources and preferred
affinity are left to the scheduler: they decide where a worker goes, not whether the feature is
on offer to it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from controller.policy.views import NodeView


def allows(pod_spec: Mapping[str, Any], node: NodeView) -> bool:
    """Whether a pod with this spec may be placed on `node` by its labels and name: every
    `nodeSelector` pair matches, and (if set) one of the required affinity's terms does."""
    selector = pod_spec.get("nodeSelector") or {}
    if not all(node.labels.get(k) == v for k, v in selector.items()):
        return False
    affinity = (pod_spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return True
    # Terms are ORed; a term with no requirement at all matches no node (as the scheduler has it).
    return any(_term_matches(t, node) for t in required.get("nodeSelectorTerms") or [])


def _term_matches(term: Mapping[str, Any], node: NodeView) -> bool:
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False
    return all(_requirement(e, node.labels) for e in expressions) and all(
        _requirement(f, {"metadata.name": node.name}) for f in fields
    )


def _requirement(expr: Mapping[str, Any], values_of: Mapping[str, str]) -> bool:
    """One `NodeSelectorRequirement` against labels (or fields). An operator the scheduler
    would refuse matches nothing."""
    key, op = expr.get("key"), expr.get("operator")
    values: Sequence[str] = expr.get("values") or []
    present = key in values_of
    value = values_of.get(key) if isinstance(key, str) else None
    if op == "In":
        return present and value in values
    if op == "NotIn":
        return not present or value not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and len(values) == 1:
        left, right = _integer(value), _integer(values[0])
        if left is None or right is None:
            return False
        return left > right if op == "Gt" else left < right
    return False


def _integer(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None
