"""Gang restart latency at scale on the `sim` cluster: in place against Recreate, side by side.

    python -m benchmarks.scale [--sizes 100,1000] [--with-5000] [--reps 3]
                               [--scheduler-qps 500] [--endpoint-batch 1]
                               [--restart-delay 2.0] [--keep]
                               [--peers jobset [--peer-max-size 1000] [--peer-qps 500]]

For each gang size N, in one run and on one cluster (real apiserver, scheduler and
controller-manager; KWOK nodes; the real controller as a subprocess with its own RBAC; the real
agent for every pod, thousands in this process, and `localcluster.simkubelet` playing the
kubelet's part of a KEP-5532 whole-pod restart with the measured ~2 s delay):

- in-place: one worker's trainer exits 1 (a retriable code): failure visible (the kubelet's
  status write) -> epoch bumped -> every worker arrived -> barrier open;
- process: the same failure in a `Process` gang (`spec.restart.mode: Process`): every agent
  stops its trainer and starts it again behind the barrier, in the same pod; timed from the
  trainer's exit (the kubelet writes no status for it) -> epoch -> arrived -> barrier open;
- node-lost: the node of one worker (alone on a small node) dies: that worker is force-deleted
  and recreated elsewhere, the rest restart in place;
- recreate: the same failure in a `Recreate` gang: every pod deleted, recreated, scheduled,
  Running, arrived, barrier open;
- in-place-annotation: in-place with arrival by pod annotation and each agent's own watch
  (N <= 1000 only: at N=5000 it overruns its deadline);
- floor: the protocol's physical limit in place, the real pieces minus the controller's
  decisions: this process writes `status.epoch` = E+1; the time until every agent saw it,
  every pod restarted and every arrival report was accepted, plus the barrier write seen by
  every agent (benchmarks.scale.floors says exactly what is and is not counted);
- annotation-floor: by a bare client, N merge-patches of one pod annotation (32 in flight) and
  one write of the GangJob seen by all N agents' own watches;
- node-lost-spare, node-lost-spare-pod, node-lost-shrink, node-lost-wait (only when named): a
  worker's node dies with no room left for its new pod (every node tainted NoSchedule
  meanwhile), each in a gang of its own, `Process` but for node-lost-spare-pod: elastic with one
  spare, which takes the worker's place in place (node-lost-spare-pod: the same in `Pod` mode,
  every pod restarted in place); elastic with `waitSeconds: 0`, which goes on at N-1; not
  elastic, which waits (reported as still waiting after `Settings.wait_bound`, 30 s); failure
  visible -> barrier;
- with `--peers jobset`, the peer: JobSet v0.12.0's failure-policy restart of the same gang
  (an Indexed Job of N pods; one pod failed by the same status patch), from the failure seen to
  all N pods of the next attempt Running, at the controller-manager's default client QPS and
  with it raised (benchmarks.scale.peer).

Each is repeated (median and p90), with the controller's own share (its metric
`gangjob_restart_controller_seconds`: watch event -> status write returned), its CPU and RSS,
its API requests per restart (`rest_client_requests_total` deltas), and the CPU every process
spent within the restart, this one (the simulation) included (benchmarks.scale.cpu). The report
ends with the goals, each "met", "not met (the step that holds it)" or "not measured"
(benchmarks.scale.goals). Times are taken by this
process's monotonic clock: the job's own watch for epoch and barrier, the simulated kubelet's
write returning for "failure visible", a 50 ms poll of the agents for arrivals. Results go to
benchmarks/results/restart_scale[-qpsQ][-epbatchS].{json,md,png}.

Every worker is behind the gang's headless Service, so each pod status change costs the
controller-manager's Endpoints and EndpointSlice controllers a pass over all N pods: at N=5000
the controller-manager took 20-27% of a core on average (a whole core at moments) while a gang
restarted. `--endpoint-batch` gives the figures with those updates batched, as an operator of
large gangs would set it.
"""
