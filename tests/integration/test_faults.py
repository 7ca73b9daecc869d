"""The short fault campaign (`python -m benchmarks.faults --short`): ten seeded faults of ten
kinds on two gangs (`Pod` 3, `Process` 4) under two controller replicas, on the sim cluster:
every fault recovered and the independent observer saw no invariant broken."""

from __future__ import annotations

import pytest

from benchmarks.faults.runner import SHORT_SHAPES, Settings, run
from localcluster.cluster import Cluster

pytestmark = pytest.mark.integration

SEED = 18
FAULTS = 10


async def test_short_campaign_recovers_every_fault_without_a_violation(
    sim_cluster: Cluster,
) -> None:
    settings = Settings(seed=SEED, faults=FAULTS, cluster=sim_cluster.name, shapes=SHORT_SHAPES)
    result = await run(settings)
    print(f"seed {SEED}: " + ", ".join(f"{r.kind} {r.seconds:.1f}s" for r in result.rows))
    assert len(result.rows) == FAULTS
    assert len({r.kind for r in result.rows}) == FAULTS  # ten different kinds
    assert [r for r in result.rows if not r.recovered] == []
    assert result.violations == []
