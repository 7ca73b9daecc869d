"""The fault kinds of the campaign and the seeded schedule that orders them: the seed alone
decides which faults come in which order (and, in the runner, which gang and worker each
hits), so a run is repeated by giving its seed again."""

from __future__ import annotations

import random

KINDS: dict[str, str] = {
    "crash": "a worker's trainer exits 1 (retriable): one gang restart in place",
    "crash-fatal": "a worker's trainer exits 3, which a FailJob rule names: the job fails",
    "crash-three": "three workers of a gang crash at once: one restart",
    "crash-during-restart": "a second worker crashes after the epoch bump, before the barrier",
    "node-lost": "a node goes NotReady with the unreachable taints, its pods stuck Terminating",
    "node-lost-during-restart": "a worker crashes, then a node of the gang is lost mid-restart",
    "device-unhealthy": "a worker's GPU turns Unhealthy (allocatedResourcesStatus)",
    "hang": "a Process-mode worker's trainer stops reporting steps and keeps running",
    "slow-device": "a Process-mode worker's device runs 3x slow: its gang moves it off its node "
    "if its rule says so, else reports it (and the device recovers)",
    "controller-kill-after-epoch": "a crash; the leader SIGKILLed once the epoch is written",
    "controller-kill-mid-arrival": "a crash; the leader SIGKILLed while arrivals come in",
    "controller-kill-after-barrier": "a crash; the leader SIGKILLed once the barrier is written",
    "leader-failover": "the leader SIGKILLed, the standby takes the Lease; then a crash",
    "apiserver-restart": "a crash, and kube-apiserver restarted at once",
    "etcd-stop": "a crash, and etcd stopped for a few seconds",
    "apiserver-overload": "kube-apiserver with --max-requests-inflight=5 (429s); a crash",
    "endpoint-lost": "the agents' arrival endpoint unreachable (annotations); a crash; back",
}
"""Each kind and what it injects."""


def schedule(seed: int, faults: int, only: list[str] | None = None) -> list[str]:
    """`faults` fault kinds (of `only`, default all) in a seeded order: every kind equally often
    (the remainder drawn without repeats), shuffled. Fewer faults than kinds: a seeded choice
    of distinct kinds."""
    rng = random.Random(seed)
    kinds = list(only or KINDS)
    out = kinds * (faults // len(kinds)) + rng.sample(kinds, faults % len(kinds))
    rng.shuffle(out)
    return out
