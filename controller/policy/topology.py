"""Whether a gang with `spec.scheduling.topologyKey` can ever fit in one domain of that node
label: the `Stuck` cause `NoTopologyDomainFits` (docs/scheduling.md).

The scheduler keeps such a gang Pending and says only that its pods are unschedulable. The
controller can say why when no domain's allocatable, summed over its schedulable nodes, covers
what the whole gang requests: then no waiting helps, and the fix is the job or the cluster.
Only whole-number resources are compared (devices such as `nvidia.com/gpu`, `pods`, whole
cpus): they are what a training gang is sized by, and comparing them cannot be wrong. A gang
that fits some domain's allocatable but not what other pods leave of it is not this cause."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from api.constants import REASON_NO_DOMAIN_FITS
from api.v1alpha1 import GangJob
from controller.policy.passstate import Pass
from controller.policy.views import NodeView, parse_quantity

PODS: Final = "pods"


def domains(nodes: Mapping[str, NodeView], key: str) -> dict[str, list[NodeView]]:
    """Value of the label -> the schedulable nodes that carry it."""
    found: dict[str, list[NodeView]] = {}
    for node in nodes.values():
        value = node.labels.get(key)
        if value is not None and not node.unschedulable:
            found.setdefault(value, []).append(node)
    return found


def _whole(value: Any) -> int | None:
    amount = parse_quantity(str(value))
    if amount is None or amount != amount.to_integral_value():
        return None
    return int(amount)


def worker_requests(template: Mapping[str, Any]) -> dict[str, int]:
    """What one worker's containers request, in whole numbers (a limit stands for a missing
    request, as the apiserver defaults it); fractions are left out."""
    total: dict[str, int] = {PODS: 1}
    for container in (template.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for name, value in asked.items():
            amount = _whole(value)
            if amount:
                total[name] = total.get(name, 0) + amount
    return total


def gang_requests(job: GangJob) -> dict[str, int]:
    """What every worker of the gang requests together."""
    total: dict[str, int] = {}
    for role in job.spec.effective_roles:
        for name, amount in worker_requests(role.template).items():
            total[name] = total.get(name, 0) + amount * role.replicas
    return total


def allocatable(nodes: list[NodeView], resources: list[str]) -> dict[str, int]:
    """The domain's allocatable of each resource (a node that does not say has none)."""
    return {
        r: sum(a for n in nodes if isinstance(a := n.allocatable.get(r, 0), int)) for r in resources
    }


def no_domain_fits(p: Pass) -> tuple[str, str] | None:
    """`Stuck` when some worker is unscheduled and no domain of the topology key can hold the
    whole gang (or no node has the label at all)."""
    key = p.job.spec.scheduling.topology_key
    if key is None or not p.config.pod_group_topology_served or p.is_finished():
        return None
    staying = p.staying()
    waiting = [w for w in p.active() if (pod := staying.get(w)) is None or pod.node_name is None]
    if not waiting:
        return None
    need = gang_requests(p.job)
    workers = len(p.job.spec.workers)
    found = domains(p.observed.nodes, key)
    if not found:
        return (
            REASON_NO_DOMAIN_FITS,
            f"No schedulable node has label {key}, and spec.scheduling.topologyKey places all "
            f"{workers} workers in one domain of it. Fix: label the nodes, or create the job "
            "again without spec.scheduling.topologyKey (it is immutable).",
        )
    resources = sorted(need)
    have = {value: allocatable(nodes, resources) for value, nodes in found.items()}
    if any(all(cap[r] >= need[r] for r in resources) for cap in have.values()):
        return None

    def shortfall(value: str) -> tuple[float, str]:
        return (min(have[value][r] / need[r] for r in resources), value)

    largest = max(have, key=shortfall)
    short = [r for r in resources if have[largest][r] < need[r]]
    asked = ", ".join(f"{r} {need[r]}" for r in short)
    held = ", ".join(f"{r} {have[largest][r]}" for r in short)
    return (
        REASON_NO_DOMAIN_FITS,
        f"The gang needs {asked} in one domain of {key} (spec.scheduling.topologyKey), and "
        f"no domain has that much allocatable: the largest of {len(have)}, {key}={largest} "
        f"({len(found[largest])} nodes), has {held}. Fix: fewer or smaller workers, a "
        "coarser topologyKey, or larger domains.",
    )
