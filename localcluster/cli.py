"""The `localcluster` command: build, up, down, kubectl, trainer-image, status."""

from __future__ import annotations

import argparse
import json
import os
import sys

from localcluster import build as buildmod
from localcluster import helm, jobset, kueue, simagents
from localcluster import node as nodemod
from localcluster.cluster import Cluster, Options, known_clusters
from localcluster.handle import ClusterError
from localcluster.versions import all_binaries, binary, cache_root


def _gates(spec: str) -> dict[str, bool]:
    gates: dict[str, bool] = {}
    for item in filter(None, spec.split(",")):
        key, sep, val = item.partition("=")
        if not sep or val not in ("true", "false"):
            raise argparse.ArgumentTypeError(f"--feature-gates: {item!r} is not Name=true|false")
        gates[key] = val == "true"
    return gates


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="localcluster",
        description="Build and run a real local Kubernetes (v1.36) for GangJob's tests and demos.",
    )
    sub = p.add_subparsers(dest="cmd", required=True)

    b = sub.add_parser("build", help="build the pinned binaries that are missing from the cache")
    b.add_argument("--force", action="store_true", help="rebuild even what is cached")
    b.add_argument("--jobset", action="store_true", help="also build JobSet, the benchmark's peer")
    b.add_argument("--helm", action="store_true", help="also build helm (the chart's tests)")
    b.add_argument(
        "--kueue", action="store_true", help="also build Kueue (its tests build it on first use)"
    )

    u = sub.add_parser("up", help="start a cluster (prints KUBECONFIG=<path> last)")
    u.add_argument("--profile", choices=["sim", "node"], default="sim")
    u.add_argument("--name", help="cluster name (default: the profile's name)")
    u.add_argument("--nodes", type=int, default=3, help="KWOK nodes (sim profile)")
    u.add_argument("--gpus-per-node", type=int, default=0, help="nvidia.com/gpu per KWOK node")
    u.add_argument("--pods-per-node", type=int, default=250, help="pod capacity of a KWOK node")
    u.add_argument("--feature-gates", type=_gates, default={}, help="e.g. Gate=false,Other=true")
    u.add_argument("--scheduler-qps", type=int, help="raise the scheduler's client QPS")
    u.add_argument(
        "--node-monitor-grace-seconds",
        type=int,
        help="how long the node controller waits before marking a silent node NotReady",
    )
    u.add_argument(
        "--endpoint-batch-seconds",
        type=float,
        help="batch the controller-manager's Endpoints/EndpointSlice updates this long",
    )
    u.add_argument(
        "--gang-scheduling",
        action="store_true",
        help="serve scheduling.k8s.io/v1alpha2 (Workload, PodGroup) and enable the scheduler's "
        "gang, topology-aware and whole-group preemption plugins (KEP-4671, KEP-5732; gates "
        "GenericWorkload, GangScheduling, TopologyAwareWorkloadScheduling, "
        "WorkloadAwarePreemption)",
    )

    u.add_argument(
        "--agents",
        action="store_true",
        help="sim profile: also run the simulated kubelet with the real agent for every GangJob "
        "pod on the KWOK nodes (the sim-agents component; `kill-worker` fails a worker)",
    )

    kw = sub.add_parser(
        "kill-worker",
        help="a worker's trainer exits with --code, as a crash would (a sim cluster up with "
        "--agents): Pod mode restarts the gang in place",
    )
    kw.add_argument("job", help="the GangJob")
    kw.add_argument("rank", type=int, nargs="?", help="the worker's rank (or --pod)")
    kw.add_argument("--pod", help="the worker's pod, instead of a rank")
    kw.add_argument("-n", "--namespace", default="default")
    kw.add_argument("--name", default="sim", help="the cluster (default: sim)")
    kw.add_argument(
        "--code", type=int, default=1,
        help="the trainer's exit code (default 1: in the failure policy's default restart rule)",
    )  # fmt: skip

    d = sub.add_parser("down", help="stop a cluster and undo its changes to the host")
    d.add_argument("--profile", choices=["sim", "node"], default="sim")
    d.add_argument("--name", help="cluster name (default: the profile's name)")
    d.add_argument("--all", action="store_true", help="every cluster that localcluster started")

    k = sub.add_parser(
        "kubectl", help="run the pinned kubectl (built if missing); --name picks a local cluster"
    )
    k.add_argument("--name", help="use this local cluster's admin kubeconfig")
    k.add_argument("args", nargs=argparse.REMAINDER, help="kubectl's own arguments, after --")

    t = sub.add_parser(
        "trainer-image",
        help="build the PyTorch trainer image of manifests/samples (once, cached) and import it "
        "into a node-profile cluster",
    )
    t.add_argument("--name", default="node", help="the node-profile cluster (default: node)")

    s = sub.add_parser("status", help="say what runs")
    s.add_argument("--json", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.cmd == "build":
            built = buildmod.build(sys.stderr, force=args.force)
            for b in all_binaries():
                print(f"{b.name:24} {b.version:8} {b.path}")
            if not built:
                print(f"all binaries cached in {cache_root()}", file=sys.stderr)
            if args.jobset:
                path = jobset.CONTROLLER.ensure_built(sys.stderr, force=args.force)
                print(f"{'jobset-controller':24} {jobset.CONTROLLER.version:8} {path}")
            if args.helm:
                path = helm.ensure_built(sys.stderr)
                print(f"{'helm':24} {helm.binary_path().parent.name:8} {path}")
            if args.kueue:
                path = kueue.MANAGER.ensure_built(sys.stderr, force=args.force)
                print(f"{'kueue-manager':24} {kueue.MANAGER.version:8} {path}")
            return 0
        if args.cmd == "up":
            cluster = Cluster(args.name or args.profile)
            opts = Options(
                profile=args.profile,
                nodes=args.nodes if args.profile == "sim" else 1,
                gpus_per_node=args.gpus_per_node,
                pods_per_node=args.pods_per_node,
                feature_gates=args.feature_gates,
                scheduler_qps=args.scheduler_qps,
                node_monitor_grace_seconds=args.node_monitor_grace_seconds,
                endpoint_batch_seconds=args.endpoint_batch_seconds,
                gang_scheduling=args.gang_scheduling,
                agents=args.agents,
            )
            kubeconfig = cluster.up(opts, sys.stderr)
            print(f"KUBECONFIG={kubeconfig}")
            return 0
        if args.cmd == "kill-worker":
            if args.rank is None and not args.pod:
                raise ClusterError("kill-worker: give the worker's rank or --pod")
            done = simagents.kill_worker(
                Cluster(args.name), args.namespace, args.job, args.rank,
                pod=args.pod, code=args.code,
            )  # fmt: skip
            print(
                f"{done['namespace']}/{done['pod']}: its trainer exited {done['code']}: "
                f"{done['what']}\nwatch: localcluster kubectl --name {args.name} -- "
                f"-n {done['namespace']} get gj {args.job} -w"
            )
            return 0
        if args.cmd == "down":
            targets = known_clusters() if args.all else [Cluster(args.name or args.profile)]
            for c in targets:
                c.down(sys.stderr)
            return 0
        if args.cmd == "kubectl":
            kubectl = binary("kubectl").path
            if not kubectl.exists():
                buildmod.build(sys.stderr)
            env = dict(os.environ)
            if args.name:
                env["KUBECONFIG"] = str(Cluster(args.name).kubeconfig)
            rest = args.args[1:] if args.args[:1] == ["--"] else args.args
            os.execve(kubectl, [str(kubectl), *rest], env)
        if args.cmd == "trainer-image":
            cluster = Cluster(args.name)
            if not cluster.is_up() or cluster.load()["options"]["profile"] != "node":
                raise ClusterError(f"no node-profile cluster {args.name!r} is up")
            print(nodemod.ensure_trainer_image(cluster, sys.stderr))
            return 0
        if args.cmd == "status":
            info = [c.describe() for c in known_clusters()]
            if args.json:
                print(json.dumps(info, indent=2))
            elif not info:
                print("no local clusters")
            for ci in [] if args.json else info:
                state = "up" if ci["up"] else "down (partly running)"
                print(f"{ci['name']:12} {ci['profile'] or '?':5} {state:22} {ci['apiserver']}")
                for p in ci["processes"]:
                    run = "running" if p["running"] else "exited"
                    print(f"    {p['name']:24} pid {p['pid']:<8} {run}")
                if ci["host_address"]:
                    print(f"    pods reach this host at {ci['host_address']}")
                print(f"    KUBECONFIG={ci['kubeconfig']}")
            return 0
    except (ClusterError, buildmod.BuildError, OSError, RuntimeError) as e:
        print(f"localcluster: {e}", file=sys.stderr)
        return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
