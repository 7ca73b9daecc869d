"""JobSet (sigs.k8s.io/jobset), the scale benchmark's peer, run out of cluster on a local cluster.

This module owns everything about the peer:
- what it is built from (`CONTROLLER`: the Go module, built into the cache with its CRD
  manifests beside the binary by `localcluster.outofcluster`);
- running its controller out of cluster against a local cluster, its CRDs applied
  (`start_controller` -> `outofcluster.AddonProcess`);
- JobSet objects as its controller expects them (`jobset_manifest`, `webhook_defaults`), and the
  status patch that fails one of its pods (`failed_pod_status`).

The controller runs without its webhooks: no webhook configuration is applied, so the apiserver
never calls them. Its manager still serves them (it cannot be told not to), on a loopback port
with a throwaway self-signed certificate. What the mutating webhook would have defaulted, and
the controller dereferences unchecked (successPolicy, startupPolicy, network, ...), is filled in
by `webhook_defaults` instead.

KWOK's stock `pod-complete` stage completes every Running pod that a Job owns at once, which
would end a JobSet as soon as it started. The peer's pods carry `KEEP_RUNNING_LABEL`, which the
cluster's KWOK stages must skip (`keeps_pods_running` says whether they do).
"""

from __future__ import annotations

import copy
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TextIO

import yaml

from localcluster import outofcluster
from localcluster.addons import free_ports
from localcluster.handle import ClusterHandle
from localcluster.outofcluster import Addon, AddonProcess, workdir
from localcluster.versions import JOBSET_VERSION

JsonDict = dict[str, Any]

MODULE = "sigs.k8s.io/jobset"
GROUP = "jobset.x-k8s.io"
API_VERSION = f"{GROUP}/v1alpha2"
PLURAL = "jobsets"
KIND = "JobSet"
CRD_NAME = f"{PLURAL}.{GROUP}"

# Labels JobSet's controller puts on its Jobs and their pods.
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
RESTART_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"

KEEP_RUNNING_LABEL = "localcluster.gangjob.io/keep-running"
"""A pod with this label is left Running by KWOK: the cluster's `pod-complete` stage must skip
it. KWOK completes every Running pod that a Job owns at once, and JobSet's pods are owned by
Jobs; GangJob's pods are not, so only the peer needs this."""

DEFAULT_IMAGE = "localhost/busybox:dev"  # never pulled: KWOK runs no containers


class JobSetError(RuntimeError):
    """The peer could not be built, installed or started; the message says where to look."""


CONTROLLER = Addon(
    component="jobset",
    binary="jobset-controller",
    module=MODULE,
    version=JOBSET_VERSION,
    # The manager's main package is the module root (`main.go`); `cmd/` holds only the
    # in-place-restart agent, a sidecar image.
    package=".",
    cold_build_seconds=200,  # measured on 2 cores with an empty Go build cache
    error=JobSetError,
)


# ---- talking to the cluster's apiserver -----------------------------------------------------


def keeps_pods_running(cluster: ClusterHandle) -> bool:
    """Whether the cluster's KWOK leaves pods labelled `KEEP_RUNNING_LABEL` Running: its
    `pod-complete` stage (in ``<cluster>/kwok-stages.yaml``) must skip them."""
    try:
        docs = list(yaml.safe_load_all((cluster.dir / "kwok-stages.yaml").read_text()))
    except OSError:
        return False
    for doc in docs:
        if not doc or doc.get("metadata", {}).get("name") != "pod-complete":
            continue
        exprs = doc.get("spec", {}).get("selector", {}).get("matchExpressions", [])
        return any(
            KEEP_RUNNING_LABEL in str(e.get("key")) and e.get("operator") == "DoesNotExist"
            for e in exprs
        )
    return False


# ---- the controller process -----------------------------------------------------------------


def _self_signed(cert_dir: Path) -> None:
    """``tls.crt``/``tls.key`` for 127.0.0.1: the webhook server refuses to start without a
    certificate, though nothing will ever call it."""
    res = subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
            "-keyout", str(cert_dir / "tls.key"), "-out", str(cert_dir / "tls.crt"),
            "-days", "7", "-subj", "/CN=jobset-webhook.localcluster",
            "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
        ],
        capture_output=True,
        text=True,
    )  # fmt: skip
    if res.returncode != 0:
        raise JobSetError(f"openssl could not make the webhook certificate: {res.stderr.strip()}")


def controller_config(
    cert_dir: Path,
    webhook_port: int,
    metrics_port: int,
    health_port: int,
    qps: float,
    burst: int,
    feature_gates: Mapping[str, bool] | None = None,
) -> JsonDict:
    """The controller's ``Configuration`` (config.jobset.x-k8s.io/v1alpha1) for running out of
    cluster: no internal certificate management (it would look for a webhook Service and
    Secret), no leader election, every server on loopback."""
    cfg: JsonDict = {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        # The metrics server would otherwise make up a self-signed certificate of its own.
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}", "certDir": str(cert_dir)},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "clientConnection": {"qps": qps, "burst": burst},
    }
    if feature_gates:
        cfg["featureGates"] = dict(feature_gates)
    return cfg


def start_controller(
    cluster: ClusterHandle,
    *,
    qps: float = 500.0,
    burst: int = 500,
    feature_gates: Mapping[str, bool] | None = None,
    log_level: str = "info",
    ready_timeout: float = 60.0,
    out: TextIO = sys.stderr,
) -> AddonProcess:
    """Builds JobSet if it is not cached, applies its CRDs to `cluster`, and starts its
    controller against the cluster's admin kubeconfig; returns once the controller is ready.

    `qps`/`burst` are its client's rate limits (`--kube-api-qps`/`--kube-api-burst`; JobSet's
    own default is 500/500). `log_level` is zap's: the stock development logging is at debug
    level, which at benchmark scale costs the controller more than its work.
    The log goes to ``<cluster>/logs/jobset-controller.log``. The process is not recorded in
    the cluster's state: `Cluster.down` stops only what `up` started; stop it first.
    """
    CONTROLLER.ensure_built(out)
    CONTROLLER.apply_crds(cluster)
    with workdir(cluster, CONTROLLER) as work:
        cert_dir = work / "certs"
        _self_signed(cert_dir)
        webhook_port, metrics_port, health_port = free_ports(3)
        config = controller_config(
            cert_dir, webhook_port, metrics_port, health_port, qps, burst, feature_gates
        )
        # Flags win over the file; given both ways so that neither default can slip in.
        flags = [f"--kube-api-qps={qps:g}", f"--kube-api-burst={burst}", "--leader-elect=false"]
        return outofcluster.start(
            CONTROLLER,
            cluster,
            work,
            config,
            health_port=health_port,
            flags=flags,
            log_level=log_level,
            ready_timeout=ready_timeout,
            out=out,
        )


# ---- JobSet objects -----------------------------------------------------------------------


def webhook_defaults(jobset: JsonDict) -> JsonDict:
    """A copy of `jobset` with what JobSet's mutating webhook (v0.12.0, `Default` in
    pkg/webhooks/jobset_webhook.go) would set. Without the webhook the controller reads some
    of these unchecked: a nil successPolicy or network makes its reconcile panic."""
    js = copy.deepcopy(jobset)
    spec = js.setdefault("spec", {})
    spec.setdefault("successPolicy", {"operator": "All"})
    spec.setdefault("startupPolicy", {"startupPolicyOrder": "AnyOrder"})
    for rjob in spec.get("replicatedJobs", []):
        job_spec = rjob.setdefault("template", {}).setdefault("spec", {})
        job_spec.setdefault("completionMode", "Indexed")
        pod_spec = job_spec.setdefault("template", {}).setdefault("spec", {})
        if not pod_spec.get("restartPolicy"):
            pod_spec["restartPolicy"] = "OnFailure"
    network = spec.setdefault("network", {})
    network.setdefault("enableDNSHostnames", True)
    network.setdefault("publishNotReadyAddresses", True)
    for i, rule in enumerate((spec.get("failurePolicy") or {}).get("rules", [])):
        if not rule.get("name"):
            rule["name"] = f"failurePolicyRule{i}"
    for policy in spec.get("volumeClaimPolicies", []):
        policy.setdefault("retentionPolicy", {"whenDeleted": "Delete"})
    return js


def jobset_manifest(
    name: str,
    *,
    workers: int,
    max_restarts: int,
    replicated_job: str = "workers",
    image: str = DEFAULT_IMAGE,
    gpus_per_pod: int = 0,
    restart_strategy: Literal["Recreate", "BlockingRecreate"] = "Recreate",
    dns_hostnames: bool = True,
    node_selector: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
) -> JsonDict:
    """A JobSet of one replicated Job whose `workers` pods run together on KWOK nodes, and
    restarts as a whole (all Jobs recreated, `RESTART_ATTEMPT_LABEL` + 1) when any pod fails,
    at most `max_restarts` times: the peer of a GangJob gang of `workers`.

    Each Job is Indexed with parallelism = completions = `workers` and backoffLimit 0, so one
    failed pod fails its Job (rather than being replaced by the Job controller), and the failed
    Job restarts the JobSet. Pods have restartPolicy Never for the same reason, and carry
    `KEEP_RUNNING_LABEL` so that KWOK leaves them Running.
    """
    container: JsonDict = {"name": "trainer", "image": image}
    if gpus_per_pod:
        gpu = {"nvidia.com/gpu": str(gpus_per_pod)}
        container["resources"] = {"limits": gpu, "requests": dict(gpu)}
    pod_labels = {**(labels or {}), KEEP_RUNNING_LABEL: "true"}
    job = {
        "name": replicated_job,
        "replicas": 1,
        "template": {
            "spec": {
                "completionMode": "Indexed",
                "parallelism": workers,
                "completions": workers,
                "backoffLimit": 0,
                "template": {
                    "metadata": {"labels": pod_labels},
                    "spec": {
                        "restartPolicy": "Never",
                        "nodeSelector": dict(node_selector or {"type": "kwok"}),
                        "containers": [container],
                    },
                },
            }
        },
    }
    return webhook_defaults(
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": name, "labels": dict(labels or {})},
            "spec": {
                "replicatedJobs": [job],
                "failurePolicy": {"maxRestarts": max_restarts, "restartStrategy": restart_strategy},
                "network": {"enableDNSHostnames": dns_hostnames},
            },
        }
    )


def failed_pod_status(pod: JsonDict, exit_code: int = 1) -> JsonDict:
    """A status merge-patch that ends `pod` as Failed, as a kubelet reports a container that
    exited with `exit_code` under restartPolicy Never (KWOK leaves Failed pods alone)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    statuses = []
    for c in pod.get("spec", {}).get("containers", []):
        statuses.append(
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "ready": False,
                "started": False,
                "restartCount": 0,
                "state": {
                    "terminated": {
                        "exitCode": exit_code,
                        "reason": "Error",
                        "startedAt": pod.get("status", {}).get("startTime", now),
                        "finishedAt": now,
                    }
                },
            }
        )
    conditions = [
        {**c, "status": "False", "lastTransitionTime": now}
        if c.get("type") in ("Ready", "ContainersReady")
        else c
        for c in pod.get("status", {}).get("conditions", [])
    ]
    return {"status": {"phase": "Failed", "containerStatuses": statuses, "conditions": conditions}}
