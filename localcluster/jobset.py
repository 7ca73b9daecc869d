"""JobSet (sigs.k8s.io/jobset), the scale benchmark's peer, run out of cluster on a local cluster.

This module owns everything about the peer:
- building its controller from the Go module proxy into the cache (`ensure_built`), with its
  CRD manifests kept beside the binary;
- applying that CRD to a local cluster (`apply_crds`) and running the controller as a process
  of its own against the cluster's admin kubeconfig (`start_controller` -> `JobSetController`);
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

import contextlib
import copy
import fcntl
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, TextIO

import yaml

from localcluster import build as buildmod
from localcluster.addons import admin_request, crd_established, free_ports
from localcluster.handle import ClusterHandle
from localcluster.procs import Proc, launch, stop, tail
from localcluster.versions import JOBSET_VERSION, cache_root

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

FIELD_MANAGER = "localcluster-jobset"
COLD_BUILD_SECONDS = 200  # measured on 2 cores with an empty Go build cache
DEFAULT_IMAGE = "localhost/busybox:dev"  # never pulled: KWOK runs no containers


class JobSetError(RuntimeError):
    """The peer could not be built, installed or started; the message says where to look."""


# ---- where it lives in the cache ------------------------------------------------------------


def cache_dir() -> Path:
    """``<cache>/jobset/<version>/``: the controller binary and ``crds/``, like the other
    components' ``<cache>/<component>/<version>/``."""
    return cache_root() / "jobset" / JOBSET_VERSION


def binary_path() -> Path:
    return cache_dir() / "jobset-controller"


def crd_dir() -> Path:
    return cache_dir() / "crds"


def is_built() -> bool:
    return binary_path().exists() and any(crd_dir().glob("*.yaml"))


# ---- build --------------------------------------------------------------------------------


@contextlib.contextmanager
def _lock() -> Iterator[None]:
    """One JobSet build at a time. Its own lock, not `build.build_lock`: a Kubernetes build
    holds that one for half an hour, and the two builds share nothing but Go's caches, which
    are safe to use concurrently."""
    (cache_root() / "build").mkdir(parents=True, exist_ok=True)
    with open(cache_root() / "build" / ".jobset.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _module_info(go: str, log: TextIO) -> JsonDict:
    out = subprocess.run(
        [go, "mod", "download", "-json", f"{MODULE}@{JOBSET_VERSION}"],
        env=buildmod.go_env(),
        capture_output=True,
        text=True,
        cwd=cache_root(),
    )
    log.write(out.stdout + out.stderr)
    if out.returncode != 0:
        raise JobSetError(f"cannot download {MODULE}@{JOBSET_VERSION}: {out.stderr.strip()}")
    info: JsonDict = json.loads(out.stdout)
    return info


def ensure_built(out: TextIO = sys.stderr, force: bool = False) -> Path:
    """Builds the JobSet controller into the cache unless it is there; returns the binary.

    `go install sigs.k8s.io/jobset@<version>` fails: it asks the module proxy for the module's
    version list (for deprecation notices), which the proxy refuses (403). Downloading the
    pinned version works, and its source is needed anyway for the CRD manifests: the binary is
    built inside the module's own source. The module cache is read-only, so that is a writable
    copy (`-mod=mod` may update its go.sum).
    """
    if not force and is_built():
        return binary_path()
    cache_root().mkdir(parents=True, exist_ok=True)
    with _lock():
        if not force and is_built():  # built by somebody else while we waited
            return binary_path()
        go = buildmod.check_go()
        logpath = cache_root() / "build" / "jobset-build.log"
        t0 = time.monotonic()
        with open(logpath, "a") as log:
            log.write(f"\n=== jobset build started {time.strftime('%Y-%m-%dT%H:%M:%S')} ===\n")
            out.write(f"building jobset-controller {JOBSET_VERSION} (log: {logpath})\n")
            out.flush()
            info = _module_info(go, log)
            work = Path(tempfile.mkdtemp(prefix="jobset-src-", dir=cache_root() / "build"))
            try:
                src = work / "src"
                shutil.copytree(info["Dir"], src)
                for p in [src, *src.rglob("*")]:
                    p.chmod(p.stat().st_mode | 0o200)
                commit = str((info.get("Origin") or {}).get("Hash") or "unknown")
                ldflags = (
                    f"-s -w -X {MODULE}/pkg/version.GitVersion={JOBSET_VERSION}"
                    f" -X {MODULE}/pkg/version.GitCommit={commit}"
                )
                target = work / "jobset-controller"
                # The manager's main package is the module root (`main.go`); `cmd/` holds only
                # the in-place-restart agent, a sidecar image.
                cmd = [go, "build", "-v", "-ldflags", ldflags, "-o", str(target), "."]
                with buildmod.Progress(out, "jobset-controller", COLD_BUILD_SECONDS) as prog:
                    buildmod.run_logged(cmd, src, log, prog)
                crds = sorted((src / "config" / "components" / "crd" / "bases").glob("*.yaml"))
                if not crds:
                    raise JobSetError(f"{MODULE}@{JOBSET_VERSION} has no CRD manifests")
                # The CRDs first: `is_built` takes the binary's presence for a finished build.
                crd_dir().mkdir(parents=True, exist_ok=True)
                for crd in crds:
                    shutil.copyfile(crd, crd_dir() / crd.name)
                buildmod.install_binary(target, binary_path())
            finally:
                shutil.rmtree(work, ignore_errors=True)
        out.write(f"    jobset-controller: {time.monotonic() - t0:.0f}s -> {binary_path()}\n")
        return binary_path()


# ---- talking to the cluster's apiserver -----------------------------------------------------


def apply_crds(cluster: ClusterHandle, timeout: float = 60.0) -> list[str]:
    """Server-side applies JobSet's CRDs and waits until they are Established; returns their
    names. Server-side because the JobSet CRD (800 kB) is larger than the last-applied
    annotation of a client-side apply may be."""
    if not is_built():
        raise JobSetError("JobSet is not built: call ensure_built() first")
    names: list[str] = []
    for path in sorted(crd_dir().glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc:
                continue
            name = doc["metadata"]["name"]
            # JSON is YAML: the apply-patch body can be the parsed document.
            admin_request(
                cluster,
                "PATCH",
                f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
                f"?fieldManager={FIELD_MANAGER}&force=true",
                doc,
                content_type="application/apply-patch+yaml",
                timeout=60.0,
            )
            names.append(name)
    deadline = time.monotonic() + timeout
    pending = list(names)
    while pending:
        pending = [
            n
            for n in pending
            if not crd_established(
                admin_request(
                    cluster, "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{n}"
                )
            )
        ]
        if not pending:
            break
        if time.monotonic() > deadline:
            raise JobSetError(f"CRDs {pending} not Established after {timeout:.0f}s")
        time.sleep(0.2)
    return names


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


@dataclass
class JobSetController:
    """A running JobSet controller that `start_controller` started. `stop()` ends it."""

    proc: Proc
    workdir: Path
    """Its configuration and throwaway certificate; removed by `stop()`."""
    log: Path
    metrics_port: int
    health_port: int
    webhook_port: int
    qps: float
    burst: int
    _stopped: bool = field(default=False, repr=False)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.alive()

    def ready(self) -> bool:
        """Its readyz: the manager runs and its (unused) webhook server listens."""
        try:
            url = f"http://127.0.0.1:{self.health_port}/readyz"
            with urllib.request.urlopen(url, timeout=2) as resp:
                return bool(resp.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def stop(self, timeout: float = 15.0) -> bool:
        """SIGTERM (then SIGKILL after `timeout`) to this process only, by PID and start time,
        and waits for it to end. Returns whether it was still running."""
        was_running = stop(self.proc, timeout)
        if not self._stopped:
            self._stopped = True
            shutil.rmtree(self.workdir, ignore_errors=True)
        return was_running

    def __enter__(self) -> JobSetController:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def start_controller(
    cluster: ClusterHandle,
    *,
    qps: float = 500.0,
    burst: int = 500,
    feature_gates: Mapping[str, bool] | None = None,
    log_level: str = "info",
    ready_timeout: float = 60.0,
    out: TextIO = sys.stderr,
) -> JobSetController:
    """Builds JobSet if it is not cached, applies its CRDs to `cluster`, and starts its
    controller against the cluster's admin kubeconfig; returns once the controller is ready.

    `qps`/`burst` are its client's rate limits (`--kube-api-qps`/`--kube-api-burst`; JobSet's
    own default is 500/500). `log_level` is zap's: the stock development logging is at debug
    level, which at benchmark scale costs the controller more than its work.
    The log goes to ``<cluster>/logs/jobset-controller.log``. The process is not recorded in
    the cluster's state: `Cluster.down` stops only what `up` started; stop it first.
    """
    ensure_built(out)
    apply_crds(cluster)
    workdir = Path(tempfile.mkdtemp(prefix="jobset-controller-", dir=cluster.dir))
    try:
        cert_dir = workdir / "certs"
        cert_dir.mkdir()
        _self_signed(cert_dir)
        webhook_port, metrics_port, health_port = free_ports(3)
        config = workdir / "config.yaml"
        config.write_text(
            yaml.safe_dump(
                controller_config(
                    cert_dir, webhook_port, metrics_port, health_port, qps, burst, feature_gates
                )
            )
        )
        cmd = [
            str(binary_path()),
            f"--kubeconfig={cluster.kubeconfig}",
            f"--config={config}",
            # Flags win over the file; given both ways so that neither default can slip in.
            f"--kube-api-qps={qps:g}",
            f"--kube-api-burst={burst}",
            "--leader-elect=false",
            "--zap-devel=false",
            f"--zap-log-level={log_level}",
            "--zap-encoder=console",
        ]
        log = cluster.logs / "jobset-controller.log"
        out.write(f"starting jobset-controller {JOBSET_VERSION} (log: {log})\n")
        proc = launch("jobset-controller", cmd, log, cwd=workdir)
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    ctl = JobSetController(proc, workdir, log, metrics_port, health_port, webhook_port, qps, burst)
    deadline = time.monotonic() + ready_timeout
    try:
        while not ctl.ready():
            if not ctl.alive():
                raise JobSetError(f"jobset-controller exited; last lines of {log}:\n{tail(log)}")
            if time.monotonic() > deadline:
                raise JobSetError(
                    f"jobset-controller not ready after {ready_timeout:.0f}s; last lines of "
                    f"{log}:\n{tail(log)}"
                )
            time.sleep(0.2)
    except BaseException:
        ctl.stop()
        raise
    return ctl


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
