"""`gangjob-controller`: the command line, structured logs, signals, tracing; then `Manager.run`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from typing import Any

from controller.k8s import Kube
from controller.k8s.leader import timing_problem
from controller.manager import Manager, Settings, default_identity
from controller.policy.quarantine import QuarantineConfig
from controller.runtime import tracing
from controller.runtime.servingcert import small_tls_buffers
from controller.servingsecret import DEFAULT_SECRET


class JsonFormatter(logging.Formatter):
    """One JSON object per line: what log collectors (and `jq`) expect from a controller."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def address(value: str) -> tuple[str, int] | None:
    """`host:port`, `:port` (all interfaces) or `0` (off), as controller-runtime's flags."""
    if value == "0":
        return None
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r} is not host:port, :port or 0")
    return (host or "0.0.0.0", int(port))


def seconds(text: str) -> float:
    """A duration in seconds: `15` or `15s` (kube-controller-manager's flags say `15s`)."""
    try:
        value = float(text.removesuffix("s"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration in seconds") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a duration must be positive")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gangjob-controller",
        description="GangJob controller: coordinated in-place restarts of training gangs.",
    )
    p.add_argument("--kubeconfig", help="kubeconfig path (default: in-cluster, then $KUBECONFIG)")
    p.add_argument("--namespace", default="", help="watch only this namespace (default: all)")
    p.add_argument("--leader-elect", action="store_true", help="hold a Lease while reconciling")
    p.add_argument("--leader-election-namespace", default="", help="namespace of the Lease")
    p.add_argument("--leader-election-id", default="gangjob-controller", help="name of the Lease")
    p.add_argument(
        "--leader-elect-lease-duration",
        type=seconds,
        default=15.0,
        help="how long a standby waits after the leader's last renewal before taking the "
        "Lease, as kube-controller-manager's flag: a failover takes about this long "
        "(default 15s)",
    )
    p.add_argument(
        "--leader-elect-renew-deadline",
        type=seconds,
        default=10.0,
        help="how long the leader keeps trying to renew before it stops leading; below the "
        "lease duration (default 10s)",
    )
    p.add_argument(
        "--leader-elect-retry-period",
        type=seconds,
        default=2.0,
        help="between two tries at renewing or taking the Lease (default 2s)",
    )
    p.add_argument("--metrics-bind-address", type=address, default=("0.0.0.0", 8080))
    p.add_argument("--health-probe-bind-address", type=address, default=("0.0.0.0", 8081))
    p.add_argument(
        "--arrival-bind-address",
        type=address,
        default=None,
        help="serve the agents' arrival endpoint here (host:port, :port; default off)",
    )
    p.add_argument(
        "--arrival-url",
        default="",
        help="the endpoint as pods reach it, e.g. https://gangjob-arrivals.gangjob-system.svc:8082 "
        "(given to every agent; default: agents arrive by pod annotation). https:// serves it "
        "over TLS: with the --arrival-tls-*-file given, else with a CA and certificate the "
        "controller makes, renews and keeps in the Secret --arrival-tls-secret; http:// serves "
        "it in clear (for a controller run out of the cluster)",
    )
    p.add_argument(
        "--arrival-tls-cert-file",
        default="",
        help="serve the https:// arrival endpoint with this certificate (PEM; with "
        "--arrival-tls-key-file), loaded again when it changes, e.g. a mounted Secret that "
        "cert-manager renews",
    )
    p.add_argument("--arrival-tls-key-file", default="", help="the certificate's private key")
    p.add_argument(
        "--arrival-tls-ca-file",
        default="",
        help="with --arrival-tls-cert-file: the CA (PEM) that agents verify the endpoint with, "
        "given to every worker pod (e.g. cert-manager's ca.crt; default: their system store)",
    )
    p.add_argument(
        "--arrival-tls-secret",
        default=DEFAULT_SECRET,
        help="the Secret, in the controller's namespace, where it keeps the https:// arrival "
        f"endpoint's own CA and certificate when no files are given (default {DEFAULT_SECRET})",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--log-format", default="json", choices=["json", "text"])
    p.add_argument("--workers", type=int, default=4, help="concurrent reconciles")
    p.add_argument(
        "--agent-image",
        default="localhost/gangjob-agent:dev",
        help="image of the in-pod agent (the Pod-mode sidecar)",
    )
    p.add_argument(
        "--barrier-stall-seconds",
        type=float,
        default=120.0,
        help="a gang whose barrier waits this long for some worker is marked Stuck "
        "(BarrierStalled), naming who has not arrived (default 120)",
    )
    p.add_argument(
        "--recheck-seconds",
        type=float,
        default=30.0,
        help="how often a stuck gang is looked at again with no event, and the worker "
        "ServiceAccounts' RBAC reviewed again: a ClusterRole fixed by hand is seen within it "
        "(default 30)",
    )
    q = QuarantineConfig()
    p.add_argument(
        "--quarantine-nodes",
        action="store_true",
        help="taint gangjob.io/suspect=<class>:NoSchedule a node on which the controller "
        "restarted or moved workers for a Hang, a Straggler, a device failure or a crash with "
        "a node condition --quarantine-threshold times within --quarantine-window-seconds, "
        "for --quarantine-seconds (needs `patch` on nodes: the chart's and kustomize's "
        "quarantine option)",
    )
    p.add_argument(
        "--quarantine-threshold",
        type=int,
        default=q.threshold,
        help=f"strikes that make a node suspect (default {q.threshold})",
    )
    p.add_argument(
        "--quarantine-window-seconds",
        type=float,
        default=q.window_seconds,
        help=f"how long a strike counts, and a node an admin untainted stays so (default "
        f"{q.window_seconds:g})",
    )
    p.add_argument(
        "--quarantine-seconds",
        type=float,
        default=q.taint_seconds,
        help=f"how long a suspect node keeps its taint (default {q.taint_seconds:g})",
    )
    p.add_argument(
        "--quarantine-max-share",
        type=float,
        default=q.max_share,
        help=f"at most this share of the nodes suspect at once, rounded down (default "
        f"{q.max_share:g})",
    )
    return p


def setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    # The client library's own request logging is far too chatty at info.
    logging.getLogger("kubernetes_asyncio").setLevel(logging.WARNING)


def _own_pod() -> tuple[str, str] | None:
    """(namespace, name) from the downward API (manifests/manager sets both), else None."""
    ns, name = os.environ.get("POD_NAMESPACE"), os.environ.get("POD_NAME")
    return (ns, name) if ns and name else None


def _in_cluster_namespace() -> str:
    path = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
    with contextlib.suppress(OSError), open(path) as fh:
        return fh.read().strip()
    return "default"


async def run(args: argparse.Namespace) -> int:
    provider = tracing.setup_tracing()
    own_pod = _own_pod()
    election_namespace = args.leader_election_namespace or args.namespace or _in_cluster_namespace()
    tls_files = bool(args.arrival_tls_cert_file)
    own_cert = args.arrival_url.startswith("https://") and not tls_files
    settings = Settings(
        namespace=args.namespace or None,
        leader_elect=args.leader_elect,
        leader_election_namespace=election_namespace,
        leader_election_id=args.leader_election_id,
        leader_election_timing=(
            args.leader_elect_lease_duration,
            args.leader_elect_renew_deadline,
            args.leader_elect_retry_period,
        ),
        metrics_address=args.metrics_bind_address,
        health_address=args.health_probe_bind_address,
        workers=args.workers,
        agent_image=args.agent_image,
        identity=default_identity(),
        arrival_address=args.arrival_bind_address,
        arrival_url=args.arrival_url or None,
        arrival_tls=(args.arrival_tls_cert_file, args.arrival_tls_key_file) if tls_files else None,
        arrival_ca_file=args.arrival_tls_ca_file or None,
        # In the controller's own namespace, where its Role grants the Secret.
        arrival_tls_secret=(own_pod[0] if own_pod else election_namespace, args.arrival_tls_secret)
        if own_cert
        else None,
        own_pod=own_pod,
        barrier_stall_seconds=args.barrier_stall_seconds,
        recheck_seconds=args.recheck_seconds,
        quarantine=QuarantineConfig(
            threshold=args.quarantine_threshold,
            window_seconds=args.quarantine_window_seconds,
            taint_seconds=args.quarantine_seconds,
            max_share=args.quarantine_max_share,
        )
        if args.quarantine_nodes
        else None,
    )
    kube = await Kube.connect(args.kubeconfig)
    manager = Manager(kube, settings)
    main_task = asyncio.current_task()
    assert main_task is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, main_task.cancel)
    log = logging.getLogger("controller")
    log.info("starting: namespace=%s identity=%s", settings.namespace or "*", settings.identity)
    try:
        return await manager.run()
    except asyncio.CancelledError:
        log.info("shutting down")
        return 0
    finally:
        await kube.close()
        provider.shutdown()


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    setup_logging(args.log_level, args.log_format)
    if args.workers < 1:
        print("gangjob-controller: --workers must be at least 1", file=sys.stderr)
        return 2
    if bool(args.arrival_tls_cert_file) != bool(args.arrival_tls_key_file):
        print(
            "gangjob-controller: --arrival-tls-cert-file and --arrival-tls-key-file go together",
            file=sys.stderr,
        )
        return 2
    if args.arrival_tls_cert_file and not args.arrival_url.startswith("https://"):
        print(
            "gangjob-controller: --arrival-tls-cert-file needs an https:// --arrival-url",
            file=sys.stderr,
        )
        return 2
    problem = timing_problem(
        args.leader_elect_lease_duration,
        args.leader_elect_renew_deadline,
        args.leader_elect_retry_period,
        names=(
            "--leader-elect-lease-duration",
            "--leader-elect-renew-deadline",
            "--leader-elect-retry-period",
        ),
    )
    if problem is not None:
        print(f"gangjob-controller: {problem}", file=sys.stderr)
        return 2
    if args.arrival_url.startswith("https://"):
        small_tls_buffers()  # a TLS stream per agent: ~300 KiB each on asyncio's defaults
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
