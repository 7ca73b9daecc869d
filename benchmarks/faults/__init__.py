"""The fault campaign: GangJob's promise (a gang survives its failures) tested by many injected
faults of every kind, some combined, on the `sim` cluster, checked by an independent observer.

    python -m benchmarks.faults [--seed 1] [--faults 105] [--short] [--cluster faults]
                                [--report docs/reliability.md]

Several gangs run at once (`Pod` and `Process` restart modes, 3 to 16 workers), under the real
controller as two replicas electing a leader, with the real agent for every worker run in this
process and `localcluster.simkubelet` playing the kubelet. The seed orders the faults
(`schedule`) and picks each one's gang, worker and node, so a run is repeated by its seed.
Each fault (`inject`) is injected once the gangs run steady; the gangs it touched must be back
at an open barrier (or Failed, for a non-retriable exit) within the bound. The observer
(`observer`) checks the invariants all along; the report (`report`, docs/reliability.md) gives
per fault kind the faults injected and recovered, the recovery time and the violations. The
exit status is 0 only with every fault recovered and no violation.
"""
