"""The short fault campaign (`python -m benchmarks.faults --short --lease-duration 6`): one
seeded fault of each kind, on two gangs (`Pod` 3, `Process` 4) under two controller replicas, on a
sim cluster of its own (it restarts the apiserver, stops etcd and overloads the control plane,
which the other tests' cluster must not suffer): every fault recovered and the independent
observer saw no invariant broken."""

from __future__ import annotations

import pytest

from benchmarks.faults.runner import SHORT_SHAPES, Settings, run
from benchmarks.faults.schedule import KINDS
from tests.conftest import CLUSTER_PREFIX

pytestmark = pytest.mark.integration

SEED = 18


async def test_short_campaign_recovers_every_fault_without_a_violation() -> None:
    # The run starts this cluster and takes it down at its end.
    cluster = f"{CLUSTER_PREFIX}-faults"
    faults = len(KINDS)
    # A 6 s Lease, not 15: the four failover kinds each wait it out.
    settings = Settings(
        seed=SEED, faults=faults, cluster=cluster, shapes=SHORT_SHAPES, lease_duration=6.0
    )
    result = await run(settings)
    print(f"seed {SEED}: " + ", ".join(f"{r.kind} {r.seconds:.1f}s" for r in result.rows))
    assert len(result.rows) == faults
    assert {r.kind for r in result.rows} == set(KINDS)  # each kind once
    assert [r for r in result.rows if not r.recovered] == []
    assert result.violations == []
