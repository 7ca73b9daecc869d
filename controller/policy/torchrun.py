"""The torchrun contract of a ranked worker (docs/torchrun.md): how many processes a pod runs
(`spec.nprocPerNode`, `auto` from the trainer's GPU limit) and the `PET_*` variables torchrun
reads, one pod being one torchrun node. Pure: numbers in, env entries out.

The rendezvous id is not here: it changes with the epoch, which an in-place restart does not
write into the pod, so the agent sets it where it starts the trainer (`agent.protocol`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from api.constants import (
    ENV_PET_MASTER_ADDR,
    ENV_PET_MASTER_PORT,
    ENV_PET_MAX_RESTARTS,
    ENV_PET_NNODES,
    ENV_PET_NODE_RANK,
    ENV_PET_NPROC_PER_NODE,
    GPU_RESOURCES,
    NPROC_AUTO,
)
from controller.policy.views import parse_quantity

DEFAULT_NPROC_PER_NODE = 1
"""`spec.nprocPerNode` unset, or `auto` on a trainer without a GPU limit: one process a pod."""


def gpu_limit(container: Mapping[str, Any]) -> int:
    """The container's limit of the first of `GPU_RESOURCES` it has (a request alone does not
    count: Kubernetes requires extended resources in the limits); 0 without any."""
    limits = (container.get("resources") or {}).get("limits") or {}
    for resource in GPU_RESOURCES:
        if resource in limits:
            quantity = parse_quantity(str(limits[resource]))
            return int(quantity) if quantity is not None else 0
    return 0


def nproc_per_node(value: int | str | None, trainer: Mapping[str, Any]) -> int:
    """Processes torchrun starts in each pod: `value` as given, `auto` = the trainer's GPU
    limit (1 without one), unset = 1."""
    if value is None:
        return DEFAULT_NPROC_PER_NODE
    if value == NPROC_AUTO:
        return gpu_limit(trainer) or DEFAULT_NPROC_PER_NODE
    return int(value)


def torchrun_env(
    node_rank: int, nnodes: int, nproc: int, master_addr: str, master_port: int
) -> list[dict[str, Any]]:
    """What torchrun reads, for the node `node_rank` of `nnodes` running `nproc` processes:
    its workers get `RANK = node_rank * nproc + local rank` and `WORLD_SIZE = nnodes * nproc`
    from torchrun itself. `PET_MAX_RESTARTS=0`: restarts are the gang's."""
    return [
        {"name": ENV_PET_NNODES, "value": str(nnodes)},
        {"name": ENV_PET_NODE_RANK, "value": str(node_rank)},
        {"name": ENV_PET_NPROC_PER_NODE, "value": str(nproc)},
        {"name": ENV_PET_MASTER_ADDR, "value": master_addr},
        {"name": ENV_PET_MASTER_PORT, "value": str(master_port)},
        {"name": ENV_PET_MAX_RESTARTS, "value": "0"},
    ]
