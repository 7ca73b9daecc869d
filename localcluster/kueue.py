"""Kueue (sigs.k8s.io/kueue), quota admission of GangJobs, run out of cluster on a local cluster.

This module owns everything about it:
- what it is built from (`MANAGER`: the Go module, patched by `_patch_source`, built into the
  cache with its CRD and webhook manifests beside the binary by `localcluster.outofcluster`);
- running its manager out of cluster against a local cluster, its CRDs and admission webhook
  configurations applied (`start` -> `outofcluster.AddonProcess`, whose `stop` removes the
  webhook configurations again);
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
import os
import shutil
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, TextIO

import yaml

from localcluster import outofcluster, pki
from localcluster.addons import admin_request, free_ports
from localcluster.handle import ClusterHandle
from localcluster.outofcluster import Addon, AddonProcess, workdir
from localcluster.versions import KUEUE_VERSION

JsonDict = dict[str, Any]

MODULE = "sigs.k8s.io/kueue"
GROUP = "kueue.x-k8s.io"
API_VERSION = f"{GROUP}/v1beta2"  # the storage version of v0.15's CRDs
NAMESPACE = "kueue-system"
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
WEBHOOK_CONFIGURATION = "localcluster-kueue"
"""The name of both webhook configurations, mutating and validating."""
METRICS_CERTS_ENV = "LOCALCLUSTER_KUEUE_METRICS_CERTS"
"""Where the built manager reads its metrics server's certificate (see `_patch_source`)."""
_METRICS_CERTS_LINE = 'metricsCertPath := "/etc/kueue/metrics/certs"'
_WEBHOOK_STEM = "kueue-webhook"
_WEBHOOK_MANIFEST = "webhooks.yaml"


class KueueError(RuntimeError):
    """Kueue could not be built, installed or started; the message says where to look."""


# ---- what it is built from -----------------------------------------------------------------


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


MANAGER = Addon(
    component="kueue",
    binary="kueue-manager",
    module=MODULE,
    version=KUEUE_VERSION,
    package="./cmd/kueue",
    cold_build_seconds=600,  # measured 434-739 s on 2 cores at idle priority (docs/scheduling.md)
    error=KueueError,
    manifests={_WEBHOOK_MANIFEST: "config/components/webhook/manifests.yaml"},
    patch=_patch_source,
)


def webhook_manifest() -> Path:
    """The webhook configurations Kueue ships, kept beside its binary."""
    return MANAGER.cache_dir() / _WEBHOOK_MANIFEST


# ---- cluster objects ------------------------------------------------------------------------


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
        MANAGER.apply(cluster, path, obj)


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


def start(
    cluster: ClusterHandle,
    *,
    wait_for_pods_ready: JsonDict | None = None,
    ready_timeout: float = 120.0,
    out: TextIO = sys.stderr,
) -> AddonProcess:
    """Builds Kueue if it is not cached, applies its CRDs, namespace and webhook
    configurations to `cluster`, and starts its manager; returns once it is ready. The log is
    ``<cluster>/logs/kueue-manager.log``. Not recorded in the cluster's state: stop it before
    `Cluster.down`."""
    MANAGER.ensure_built(out)
    MANAGER.apply_crds(cluster)
    MANAGER.apply(
        cluster,
        f"/api/v1/namespaces/{NAMESPACE}",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
    )
    pki.ensure_webhook_pki(cluster.pki, _WEBHOOK_STEM)
    with workdir(cluster, MANAGER) as work:
        cert_dir = work / "certs"
        # controller-runtime's webhook server reads tls.crt/tls.key from its certDir.
        shutil.copyfile(cluster.pki / f"{_WEBHOOK_STEM}.crt", cert_dir / "tls.crt")
        shutil.copyfile(cluster.pki / f"{_WEBHOOK_STEM}.key", cert_dir / "tls.key")
        webhook_port, health_port = free_ports(2)
        config = manager_config(cert_dir, webhook_port, health_port, wait_for_pods_ready)
        # The metrics server is off, but its certificate is read anyway: the webhook's will do.
        env = {**os.environ, METRICS_CERTS_ENV: str(cert_dir)}
        mgr = outofcluster.start(
            MANAGER,
            cluster,
            work,
            config,
            health_port=health_port,
            env=env,
            # Pods must not be refused once it is gone.
            on_stop=lambda: remove_webhooks(cluster),
            ready_timeout=ready_timeout,
            out=out,
        )
    try:
        # Served from now on: the apiserver calls it for every labelled pod and Kueue object.
        ca = (cluster.pki / "webhook-ca.crt").read_bytes()
        for doc in webhook_configurations(webhook_port, ca):
            MANAGER.apply(cluster, _webhook_path(doc["kind"]), doc)
    except BaseException:
        mgr.stop()
        raise
    return mgr
