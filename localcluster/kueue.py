"""Kueue (sigs.k8s.io/kueue), quota admission of GangJobs, run out of cluster on a local cluster.

This module owns everything about it:
- building its manager from the Go module proxy into the cache (`ensure_built`), with its CRD
  and webhook manifests kept beside the binary;
- applying the CRDs and the admission webhook configurations to a cluster, and running the
  manager as a process of its own against the cluster's admin kubeconfig (`start` ->
  `KueueManager`; `KueueManager.stop` removes the webhook configurations again);
- a ResourceFlavor, ClusterQueue and LocalQueue (`queue_objects`).

Its admission webhooks are what gate pods (`kueue.x-k8s.io/admission` scheduling gate, added
on create) and validate them, so they are served: the manager listens on 127.0.0.1 with a
certificate from the cluster's webhook CA (`pki.ensure_webhook_pki`), and the webhook
configurations Kueue ships (service `clientConfig`) are rewritten to a URL `clientConfig`
with that CA. Only the webhooks of pods and of Kueue's own kinds are installed; the pod ones
match only pods labelled `kueue.x-k8s.io/queue-name`, so a cluster shared with other tests is
untouched, and nothing is left that would refuse pod writes once the manager is gone.

Only the `pod` integration is enabled: a GangJob's workers are a Kueue *pod group*
(controller/policy/kueue.py), which needs no Go code of ours. `waitForPodsReady` is off unless
asked for: an in-place restart makes the workers unready for a moment, and with a
`recoveryTimeout` shorter than that Kueue would evict the gang for it (kueue issue 14811).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml

from localcluster import build as buildmod
from localcluster import pki
from localcluster.addons import admin_request, crd_established, free_ports
from localcluster.handle import ClusterHandle
from localcluster.procs import Proc, launch, stop, tail
from localcluster.versions import KUEUE_VERSION, cache_root

JsonDict = dict[str, Any]

MODULE = "sigs.k8s.io/kueue"
GROUP = "kueue.x-k8s.io"
API_VERSION = f"{GROUP}/v1beta2"  # the storage version of v0.15's CRDs
NAMESPACE = "kueue-system"
FIELD_MANAGER = "localcluster-kueue"
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
WEBHOOK_CONFIGURATION = "localcluster-kueue"
"""The name of both webhook configurations, mutating and validating."""
METRICS_CERTS_ENV = "LOCALCLUSTER_KUEUE_METRICS_CERTS"
"""Where the built manager reads its metrics server's certificate (see `_patch_source`)."""
_METRICS_CERTS_LINE = 'metricsCertPath := "/etc/kueue/metrics/certs"'
COLD_BUILD_SECONDS = 600  # measured 434-739 s on 2 cores at idle priority (docs/scheduling.md)
_WEBHOOK_STEM = "kueue-webhook"


class KueueError(RuntimeError):
    """Kueue could not be built, installed or started; the message says where to look."""


# ---- where it lives in the cache ------------------------------------------------------------


def cache_dir() -> Path:
    """``<cache>/kueue/<version>/``: ``kueue-manager``, ``crds/`` and ``webhooks.yaml``."""
    return cache_root() / "kueue" / KUEUE_VERSION


def binary_path() -> Path:
    return cache_dir() / "kueue-manager"


def crd_dir() -> Path:
    return cache_dir() / "crds"


def webhook_manifest() -> Path:
    return cache_dir() / "webhooks.yaml"


def is_built() -> bool:
    return binary_path().exists() and webhook_manifest().exists() and any(crd_dir().glob("*.yaml"))


# ---- build --------------------------------------------------------------------------------


@contextlib.contextmanager
def _lock() -> Iterator[None]:
    """One Kueue build at a time (its own lock, as JobSet's: they share only Go's caches)."""
    (cache_root() / "build").mkdir(parents=True, exist_ok=True)
    with open(cache_root() / "build" / ".kueue.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _patch_source(src: Path) -> None:
    """The one change to Kueue's source: without internal certificate management its
    `cmd/kueue/main.go` reads the metrics server's certificate from the fixed path
    `/etc/kueue/metrics/certs` (a mounted Secret in a Deployment) and exits when it is missing,
    whether or not metrics are served. The path is made overridable by `METRICS_CERTS_ENV`, so
    that running it touches nothing outside the cluster's directory."""
    main = src / "cmd" / "kueue" / "main.go"
    text = main.read_text()
    if text.count(_METRICS_CERTS_LINE) != 1:
        raise KueueError(f"{main}: the line {_METRICS_CERTS_LINE!r} to patch is not there once")
    patched = (
        f"{_METRICS_CERTS_LINE}\n"
        f'\t\tif d := os.Getenv("{METRICS_CERTS_ENV}"); d != "" {{\n'
        "\t\t\tmetricsCertPath = d\n"
        "\t\t}"
    )
    main.write_text(text.replace(_METRICS_CERTS_LINE, patched))


def ensure_built(out: TextIO = sys.stderr, force: bool = False) -> Path:
    """Builds Kueue's manager into the cache unless it is there; returns the binary.

    As JobSet's: `go install` of the module fails (the proxy refuses its version list), so the
    pinned version is downloaded, copied writable, patched (`_patch_source`), and its
    `cmd/kueue` built in place; the CRD and webhook manifests come from the same source.
    """
    if not force and is_built():
        return binary_path()
    cache_root().mkdir(parents=True, exist_ok=True)
    with _lock():
        if not force and is_built():
            return binary_path()
        go = buildmod.check_go()
        logpath = cache_root() / "build" / "kueue-build.log"
        t0 = time.monotonic()
        with open(logpath, "a") as log:
            log.write(f"\n=== kueue build started {time.strftime('%Y-%m-%dT%H:%M:%S')} ===\n")
            out.write(f"building kueue-manager {KUEUE_VERSION} (log: {logpath})\n")
            out.flush()
            res = subprocess.run(
                [go, "mod", "download", "-json", f"{MODULE}@{KUEUE_VERSION}"],
                env=buildmod.go_env(),
                capture_output=True,
                text=True,
                cwd=cache_root(),
            )
            log.write(res.stdout + res.stderr)
            if res.returncode != 0:
                raise KueueError(f"cannot download {MODULE}@{KUEUE_VERSION}: {res.stderr.strip()}")
            info: JsonDict = json.loads(res.stdout)
            work = Path(tempfile.mkdtemp(prefix="kueue-src-", dir=cache_root() / "build"))
            try:
                src = work / "src"
                shutil.copytree(info["Dir"], src)
                for p in [src, *src.rglob("*")]:
                    p.chmod(p.stat().st_mode | 0o200)
                _patch_source(src)
                commit = str((info.get("Origin") or {}).get("Hash") or "unknown")
                ldflags = (
                    f"-s -w -X {MODULE}/pkg/version.GitVersion={KUEUE_VERSION}"
                    f" -X {MODULE}/pkg/version.GitCommit={commit}"
                )
                target = work / "kueue-manager"
                cmd = [go, "build", "-v", "-ldflags", ldflags, "-o", str(target), "./cmd/kueue"]
                with buildmod.Progress(out, "kueue-manager", COLD_BUILD_SECONDS) as prog:
                    buildmod.run_logged(cmd, src, log, prog)
                crds = sorted((src / "config" / "components" / "crd" / "bases").glob("*.yaml"))
                hooks = src / "config" / "components" / "webhook" / "manifests.yaml"
                if not crds or not hooks.exists():
                    raise KueueError(f"{MODULE}@{KUEUE_VERSION} lacks CRD or webhook manifests")
                # The manifests first: `is_built` takes the binary for a finished build.
                crd_dir().mkdir(parents=True, exist_ok=True)
                for crd in crds:
                    shutil.copyfile(crd, crd_dir() / crd.name)
                shutil.copyfile(hooks, webhook_manifest())
                buildmod.install_binary(target, binary_path())
            finally:
                shutil.rmtree(work, ignore_errors=True)
        out.write(f"    kueue-manager: {time.monotonic() - t0:.0f}s -> {binary_path()}\n")
        return binary_path()


# ---- cluster objects ------------------------------------------------------------------------


def _apply(cluster: ClusterHandle, path: str, doc: JsonDict) -> JsonDict:
    return admin_request(
        cluster,
        "PATCH",
        f"{path}?fieldManager={FIELD_MANAGER}&force=true",
        doc,
        content_type="application/apply-patch+yaml",
        timeout=60.0,
    )


def apply_crds(cluster: ClusterHandle, timeout: float = 60.0) -> list[str]:
    """Server-side applies Kueue's CRDs and waits until they are Established."""
    crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    names: list[str] = []
    for manifest in sorted(crd_dir().glob("*.yaml")):
        for doc in yaml.safe_load_all(manifest.read_text()):
            if doc:
                _apply(cluster, f"{crds}/{doc['metadata']['name']}", doc)
                names.append(doc["metadata"]["name"])
    deadline = time.monotonic() + timeout
    for name in names:
        while not crd_established(admin_request(cluster, "GET", f"{crds}/{name}")):
            if time.monotonic() > deadline:
                raise KueueError(f"CRD {name} not Established after {timeout:.0f}s")
            time.sleep(0.2)
    return names


def _served_here(webhook: JsonDict) -> bool:
    """A webhook of pods or of Kueue's own kinds: the others are for integrations whose CRDs
    this cluster does not have."""
    groups = {g for rule in webhook.get("rules", []) for g in rule.get("apiGroups", [])}
    resources = {r for rule in webhook.get("rules", []) for r in rule.get("resources", [])}
    return groups == {GROUP} or (groups == {""} and resources == {"pods"})


def webhook_configurations(port: int, ca_bundle: bytes) -> list[JsonDict]:
    """Kueue's mutating and validating webhook configurations, with a URL `clientConfig` to
    ``https://127.0.0.1:<port><path>`` trusting `ca_bundle` (PEM)."""
    out: list[JsonDict] = []
    for doc in yaml.safe_load_all(webhook_manifest().read_text()):
        if not doc:
            continue
        hooks = []
        for hook in doc.get("webhooks", []):
            if not _served_here(hook):
                continue
            hook = dict(hook)
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {
                "url": f"https://127.0.0.1:{port}{path}",
                "caBundle": base64.b64encode(ca_bundle).decode(),
            }
            if {g for r in hook["rules"] for g in r.get("apiGroups", [])} == {""}:
                # Kueue leaves pods without the label alone anyway; the apiserver need not ask.
                hook["objectSelector"] = {
                    "matchExpressions": [{"key": QUEUE_NAME_LABEL, "operator": "Exists"}]
                }
            hooks.append(hook)
        doc = {
            "apiVersion": doc["apiVersion"],
            "kind": doc["kind"],
            "metadata": {"name": WEBHOOK_CONFIGURATION},
            "webhooks": hooks,
        }
        out.append(doc)
    return out


def _webhook_path(kind: str) -> str:
    plural = "mutating" if kind.startswith("Mutating") else "validating"
    base = "/apis/admissionregistration.k8s.io/v1"
    return f"{base}/{plural}webhookconfigurations/{WEBHOOK_CONFIGURATION}"


def remove_webhooks(cluster: ClusterHandle) -> None:
    """Deletes the webhook configurations `start` applied (none is fine)."""
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        with contextlib.suppress(urllib.error.HTTPError):
            admin_request(cluster, "DELETE", _webhook_path(kind))


def queue_objects(
    queue: str,
    namespace: str,
    quota: dict[str, str],
    flavor: str = "default",
    cluster_queue: str | None = None,
) -> list[tuple[str, JsonDict]]:
    """(API path, object) of a ResourceFlavor `flavor`, a ClusterQueue `cluster_queue` (default
    `queue`) with `quota` (resource -> nominal quantity) in that flavor, and a LocalQueue `queue`
    in `namespace` pointing at it; apply them in this order."""
    base = f"/apis/{API_VERSION}"
    cq = cluster_queue or queue
    cq_resources = [{"name": r, "nominalQuota": q} for r, q in quota.items()]
    return [
        (
            f"{base}/resourceflavors/{flavor}",
            {"apiVersion": API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": flavor}},
        ),
        (
            f"{base}/clusterqueues/{cq}",
            {
                "apiVersion": API_VERSION,
                "kind": "ClusterQueue",
                "metadata": {"name": cq},
                "spec": {
                    "namespaceSelector": {},
                    "resourceGroups": [
                        {
                            "coveredResources": list(quota),
                            "flavors": [{"name": flavor, "resources": cq_resources}],
                        }
                    ],
                },
            },
        ),
        (
            f"{base}/namespaces/{namespace}/localqueues/{queue}",
            {
                "apiVersion": API_VERSION,
                "kind": "LocalQueue",
                "metadata": {"name": queue, "namespace": namespace},
                "spec": {"clusterQueue": cq},
            },
        ),
    ]


def apply_queue(
    cluster: ClusterHandle,
    queue: str,
    namespace: str,
    quota: dict[str, str],
    cluster_queue: str | None = None,
) -> None:
    for path, obj in queue_objects(queue, namespace, quota, cluster_queue=cluster_queue):
        _apply(cluster, path, obj)


# ---- the manager process --------------------------------------------------------------------


def manager_config(
    cert_dir: Path, webhook_port: int, health_port: int, wait_for_pods_ready: JsonDict | None = None
) -> JsonDict:
    """Kueue's ``Configuration`` (config.kueue.x-k8s.io/v1beta2) for running out of cluster:
    no internal certificate management (it would look for a Service and Secret), no leader
    election, no metrics server, no visibility API server, the pod integration only.
    `wait_for_pods_ready` is Kueue's `waitForPodsReady` (off when None: its presence enables
    it)."""
    cfg: JsonDict = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": ["pod"]},
        # Its API server would want the cluster's front-proxy and a port of its own; unused.
        "featureGates": {"VisibilityOnDemand": False},
    }
    if wait_for_pods_ready is not None:
        cfg["waitForPodsReady"] = dict(wait_for_pods_ready)
    return cfg


@dataclass
class KueueManager:
    """A running Kueue manager that `start` started; `stop()` ends it and removes its webhook
    configurations."""

    cluster: ClusterHandle
    proc: Proc
    workdir: Path
    log: Path
    health_port: int
    webhook_port: int
    _stopped: bool = field(default=False, repr=False)

    def alive(self) -> bool:
        return self.proc.alive()

    def ready(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.health_port}/readyz"
            with urllib.request.urlopen(url, timeout=2) as resp:
                return bool(resp.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def stop(self, timeout: float = 15.0) -> bool:
        """Removes the webhook configurations (pods must not be refused once it is gone), then
        SIGTERM (SIGKILL after `timeout`) to this process only. Returns whether it ran."""
        if not self._stopped:
            remove_webhooks(self.cluster)
        was_running = stop(self.proc, timeout)
        if not self._stopped:
            self._stopped = True
            shutil.rmtree(self.workdir, ignore_errors=True)
        return was_running


def start(
    cluster: ClusterHandle,
    *,
    wait_for_pods_ready: JsonDict | None = None,
    ready_timeout: float = 120.0,
    out: TextIO = sys.stderr,
) -> KueueManager:
    """Builds Kueue if it is not cached, applies its CRDs, namespace and webhook
    configurations to `cluster`, and starts its manager; returns once it is ready. The log is
    ``<cluster>/logs/kueue-manager.log``. Not recorded in the cluster's state: stop it before
    `Cluster.down`."""
    ensure_built(out)
    apply_crds(cluster)
    _apply(
        cluster,
        f"/api/v1/namespaces/{NAMESPACE}",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
    )
    pki.ensure_webhook_pki(cluster.pki, _WEBHOOK_STEM)
    workdir = Path(tempfile.mkdtemp(prefix="kueue-manager-", dir=cluster.dir))
    try:
        cert_dir = workdir / "certs"
        cert_dir.mkdir()
        # controller-runtime's webhook server reads tls.crt/tls.key from its certDir.
        shutil.copyfile(cluster.pki / f"{_WEBHOOK_STEM}.crt", cert_dir / "tls.crt")
        shutil.copyfile(cluster.pki / f"{_WEBHOOK_STEM}.key", cert_dir / "tls.key")
        webhook_port, health_port = free_ports(2)
        config = workdir / "config.yaml"
        config.write_text(
            yaml.safe_dump(manager_config(cert_dir, webhook_port, health_port, wait_for_pods_ready))
        )
        cmd = [
            str(binary_path()),
            f"--kubeconfig={cluster.kubeconfig}",
            f"--config={config}",
            "--zap-devel=false",
            "--zap-log-level=info",
            "--zap-encoder=console",
        ]
        log = cluster.logs / "kueue-manager.log"
        out.write(f"starting kueue-manager {KUEUE_VERSION} (log: {log})\n")
        # The metrics server is off, but its certificate is read anyway: the webhook's will do.
        env = {**os.environ, METRICS_CERTS_ENV: str(cert_dir)}
        proc = launch("kueue-manager", cmd, log, env=env, cwd=workdir)
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    mgr = KueueManager(cluster, proc, workdir, log, health_port, webhook_port)
    try:
        deadline = time.monotonic() + ready_timeout
        while not mgr.ready():
            if not mgr.alive():
                raise KueueError(f"kueue-manager exited; last lines of {log}:\n{tail(log)}")
            if time.monotonic() > deadline:
                raise KueueError(
                    f"kueue-manager not ready after {ready_timeout:.0f}s; last lines of "
                    f"{log}:\n{tail(log)}"
                )
            time.sleep(0.2)
        # Served from now on: the apiserver calls it for every labelled pod and Kueue object.
        ca = (cluster.pki / "webhook-ca.crt").read_bytes()
        for doc in webhook_configurations(webhook_port, ca):
            _apply(cluster, _webhook_path(doc["kind"]), doc)
    except BaseException:
        mgr.stop()
        raise
    return mgr
