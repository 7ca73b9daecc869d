"""The controller as platform teams run it, on the real node: `kubectl apply -k manifests/local`
(manifests/default with the images localcluster builds), two replicas behind the
`gangjob-arrivals` Service that kube-proxy routes. A gang restarts in place with its arrivals
over that Service, over TLS with the certificate the controller made (its CA in the worker pods,
a client with another CA refused, plain HTTP answered nothing); the leader's pod is deleted;
another replica takes the Lease, the Service follows its label, the agents reach it, and the
next failure restarts the gang in place again. A real Prometheus, in a pod, finds the replicas
through the metrics Service and scrapes them, and its queries return the restart a test
caused."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import hashlib
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from api import builders
from controller.k8s import (
    CONFIGMAPS,
    GANGJOBS,
    LEASES,
    PODS,
    SECRETS,
    JsonDict,
    Kube,
    ResourceKind,
)
from controller.manager import LEADER_LABEL
from controller.runtime import certs
from localcluster import node, prometheus
from localcluster.cluster import Cluster
from localcluster.controllerimage import CONTROLLER_IMAGE, controller_image
from localcluster.tools import REPO, SYSTEM_NS, kubectl
from tests.integration.harness import gang_pods, watch_job
from tests.waiting import wait_for

pytestmark = pytest.mark.e2e

T = TypeVar("T")
ENDPOINT_SLICES = ResourceKind("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice")
DEPLOYMENT = "gangjob-controller"
LEASE = "gangjob-controller"  # --leader-election-id's default
SELECTOR = "app.kubernetes.io/name=gangjob-controller"
LOCAL = str(REPO / "manifests" / "local")

# Rank 1 fails on its first run; afterwards any trainer fails once when the test drops a file
# into its (restart-surviving) emptyDir. Each says which epoch it trains at.
TRAINER = r"""
trap 'exit 0' TERM
if [ "$RANK" = 1 ] && [ ! -f /scratch/crashed ]; then
  touch /scratch/crashed; echo "rank 1 crashing"; exit 1
fi
echo "training at epoch $(cat $GANGJOB_DIR/epoch)"
while :; do
  if [ -f /scratch/fail ]; then rm /scratch/fail; echo "failing on request"; exit 1; fi
  sleep 1
done
"""


def gangjob(name: str) -> JsonDict:
    return builders.gangjob(
        name, 3,
        image="localhost/busybox:dev", command=["sh", "-c", TRAINER],
        container={
            "imagePullPolicy": "Never",
            "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
        },
        pod_spec={
            "terminationGracePeriodSeconds": 5,
            "volumes": [{"name": "scratch", "emptyDir": {}}],
        },
        restart_mode="Pod",
    )  # fmt: skip


def at_epoch(epoch: int) -> Callable[[JsonDict], bool]:
    def check(job: JsonDict) -> bool:
        st = job.get("status", {})
        return bool(
            st.get("epoch") == epoch
            and st.get("barrierEpoch") == epoch
            and st.get("workers", {}).get("arrived") == 3
        )

    return check


async def eventually(
    probe: Callable[[], Awaitable[T | None]], timeout: float, what: str, every: float = 0.5
) -> T:
    """Polls ``probe`` until it returns something other than None; fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        got = await probe()
        if got is not None:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} after {timeout}s")
        await asyncio.sleep(every)


def metric(text: str, name: str, labels: dict[str, str] | None = None) -> float:
    """The sum of a metric's samples with these labels, from Prometheus' text format."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        metric_name, _, rest = head.partition("{")
        if metric_name != name:
            continue
        got = dict(kv.split("=", 1) for kv in rest.rstrip("}").split(",") if "=" in kv)
        if all(got.get(k) == f'"{v}"' for k, v in (labels or {}).items()):
            total += float(value)
    return total


def scrape(cluster: Cluster, pod: str) -> str:
    """One replica's /metrics, through the apiserver's pod proxy (the admin may use it)."""
    path = f"/api/v1/namespaces/{SYSTEM_NS}/pods/{pod}:8080/proxy/metrics"
    return str(cluster.api("GET", path))


def ready(pod: JsonDict) -> bool:
    return pod.get("metadata", {}).get("deletionTimestamp") is None and any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in pod.get("status", {}).get("conditions", [])
    )


async def controller_pods(kube: Kube) -> list[JsonDict]:
    return list((await kube.list(PODS, SYSTEM_NS, label_selector=SELECTOR)).items)


async def two_ready_one_leader(kube: Kube) -> tuple[JsonDict, JsonDict] | None:
    """(leader, standby) once two replicas are Ready and exactly one is labelled leader."""
    pods = [p for p in await controller_pods(kube) if ready(p)]
    leaders = [p for p in pods if p["metadata"].get("labels", {}).get(LEADER_LABEL) == "leader"]
    if len(pods) != 2 or len(leaders) != 1:
        return None
    standby = next(p for p in pods if p is not leaders[0])
    return leaders[0], standby


async def arrival_endpoints(kube: Kube) -> list[str]:
    """The ready addresses behind the `gangjob-arrivals` Service."""
    slices = await kube.list(
        ENDPOINT_SLICES, SYSTEM_NS, label_selector="kubernetes.io/service-name=gangjob-arrivals"
    )
    return sorted(
        addr
        for s in slices.items
        for ep in s.get("endpoints") or []
        if (ep.get("conditions") or {}).get("ready")
        for addr in ep.get("addresses", [])
    )


@pytest.fixture(scope="module")
def in_cluster(node_cluster: Cluster) -> Iterator[None]:
    """manifests/local applied, the controller image of this checkout on the node; everything
    deleted afterwards (the next modules install what they need themselves)."""
    node.import_image(node_cluster, controller_image(sys.stderr), sys.stderr)
    kubectl(node_cluster, "apply", "-k", LOCAL)
    try:
        yield
    finally:
        kubectl(node_cluster, "delete", "-k", LOCAL, "--ignore-not-found", "--wait",
                timeout=300)  # fmt: skip


async def test_the_in_cluster_controller_fails_over_and_restarts_the_gang_in_place(
    node_kube: Kube, node_namespace: str, node_cluster: Cluster, in_cluster: None
) -> None:
    ns = node_namespace
    kubectl(node_cluster, "-n", SYSTEM_NS, "rollout", "status", f"deployment/{DEPLOYMENT}",
            "--timeout=180s", timeout=200)  # fmt: skip
    leader, standby = await eventually(
        lambda: two_ready_one_leader(node_kube), 120, "two Ready replicas, one leader"
    )
    for p in (leader, standby):
        assert p["spec"]["containers"][0]["image"] == CONTROLLER_IMAGE
    leader_name, standby_name = leader["metadata"]["name"], standby["metadata"]["name"]
    lease = await node_kube.get(LEASES, LEASE, SYSTEM_NS)
    assert lease["spec"]["holderIdentity"] == leader_name
    await eventually(
        lambda: _when(arrival_endpoints(node_kube), [leader["status"]["podIP"]]),
        60, "the arrival Service on the leader",
    )  # fmt: skip

    # 1. A worker fails once: the gang restarts in place, its arrivals over the Service.
    await node_kube.create(GANGJOBS, gangjob("ddp"), ns)
    job = await watch_job(node_kube, ns, "ddp", at_epoch(1), timeout=180, what="at epoch 1")
    assert job["status"]["restarts"]["total"] == 1
    assert job["status"]["restarts"]["inPlace"] == 1
    pods = await gang_pods(node_kube, ns, "ddp")
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}
    assert len(uids) == 3
    text = scrape(node_cluster, leader_name)
    # Epochs 0 and 1, three workers each, all reported to the leader's endpoint; none by the
    # annotation fallback, and nothing refused.
    assert metric(text, "gangjob_arrival_reports_total", {"result": "accepted"}) >= 6, text
    assert metric(text, "gangjob_arrival_reports_total", {"result": "unauthorized"}) == 0
    assert all("gangjob.io/epoch" not in p["metadata"].get("annotations", {}) for p in pods)
    assert metric(scrape(node_cluster, standby_name), "gangjob_arrival_reports_total") == 0
    # ... over TLS: the agents were given the CA of the controller's own certificate.
    secret = await node_kube.get(SECRETS, "gangjob-arrival-tls", SYSTEM_NS)
    tls = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    for p in pods:
        env = _agent_env(p)
        assert env["GANGJOB_ARRIVAL_URL"] == ARRIVAL_URL
        assert env["GANGJOB_ARRIVAL_CA_PEM"].strip() == tls["ca.crt"].decode().strip()
    await _probe_tls(node_kube, node_cluster, ns, "tls-probe-1", tls)

    # 2. The leader's pod goes: another replica takes the Lease within its lease duration. The
    # old leader releases it on SIGTERM, so the Deployment's replacement, polling as often as the
    # standby, may win the race; either is a correct failover.
    duration = float(lease["spec"]["leaseDurationSeconds"])
    t0 = time.monotonic()
    await node_kube.delete(PODS, leader_name, SYSTEM_NS)
    # Released on SIGTERM, the lease is taken at the standby's next try; not released (once in
    # a CI run the old leader's last renewal stood), at its expiry: a lease duration after
    # that renewal, and a retry period or two on (LeaderElectionConfig.retry_period, 2 s).
    lease = await wait_for(
        node_kube, LEASES, LEASE, SYSTEM_NS,
        lambda ls: ls["spec"].get("holderIdentity") not in ("", None, leader_name),
        duration + 2 * 2.0 + 1.0, f"held by a replica other than {leader_name}",
    )  # fmt: skip
    took_over = time.monotonic() - t0
    successor = lease["spec"]["holderIdentity"]
    role = "the standby" if successor == standby_name else "the replacement"
    print(f"{role} {successor} took the lease {took_over:.1f}s after the delete")
    new_ip = await eventually(lambda: _pod_ip(node_kube, successor), 120, f"an IP for {successor}")
    await eventually(
        lambda: _when(arrival_endpoints(node_kube), [new_ip]),
        60, "the arrival Service on the new leader",
    )  # fmt: skip
    # The agents' streams to the old leader broke; each sends its report again, to the new one
    # once the Service leads there. One that found no endpoint for 5 s (a loaded machine) has
    # written the annotation instead, by design: its next report tries the Service again, which
    # step 3 asserts. So here only what happened is printed.
    # The Deployment brings a new standby.
    await eventually(lambda: two_ready_one_leader(node_kube), 180, "a new standby")
    streams = metric(scrape(node_cluster, successor), "gangjob_arrival_streams")
    annotated = sum(
        "gangjob.io/epoch" in p["metadata"].get("annotations", {})
        for p in await gang_pods(node_kube, ns, "ddp")
    )
    print(f"after the failover: {streams:.0f} reports re-sent to the new leader, "
          f"{annotated} by annotation")  # fmt: skip

    # 3. A second failure: in place again, arrivals over the Service to the new leader.
    before = metric(scrape(node_cluster, successor), "gangjob_arrival_reports_total",
                    {"result": "accepted"})  # fmt: skip
    victim = sorted(uids)[0]
    kubectl(node_cluster, "-n", ns, "exec", victim, "-c", "trainer", "--", "touch",
            "/scratch/fail")  # fmt: skip
    job = await watch_job(node_kube, ns, "ddp", at_epoch(2), timeout=180, what="at epoch 2")
    assert job["status"]["restarts"]["total"] == 2
    assert job["status"]["restarts"]["inPlace"] == 2
    assert job["status"]["lastRestart"]["recreated"] == []
    pods = await gang_pods(node_kube, ns, "ddp")
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods} == uids
    text = scrape(node_cluster, successor)
    # The agents reached the new leader through the Service: it took the three arrivals at
    # epoch 2, none came by annotation, and all three hold their reports with it.
    assert metric(text, "gangjob_arrival_reports_total", {"result": "accepted"}) >= before + 3
    assert metric(text, "leader_election_master_status", {"name": LEASE}) == 1
    for p in pods:
        assert p["metadata"].get("annotations", {}).get("gangjob.io/epoch") != "2", p
    await eventually(
        lambda: _metric_at_least(node_cluster, successor, "gangjob_arrival_streams", 3),
        60, "three agents holding their reports with the new leader",
    )  # fmt: skip

    # The new leader serves the same certificate, kept in the Secret.
    await _probe_tls(node_kube, node_cluster, ns, "tls-probe-2", tls)

    # 4. Prometheus' way in: the metrics Service, from a pod.
    await _scrape_through_service(node_kube, node_cluster, ns)


async def _pod_ip(kube: Kube, name: str) -> str | None:
    ip = (await kube.get(PODS, name, SYSTEM_NS)).get("status", {}).get("podIP")
    return str(ip) if ip else None


async def _when(got: Awaitable[T], want: T) -> T | None:
    value = await got
    return value if value == want else None


async def _metric_at_least(cluster: Cluster, pod: str, name: str, value: float) -> float | None:
    got = await asyncio.to_thread(lambda: metric(scrape(cluster, pod), name))
    return got if got >= value else None


ARRIVAL_URL = f"https://gangjob-arrivals.{SYSTEM_NS}.svc:8082"


def _agent_env(pod: JsonDict) -> dict[str, str]:
    spec = pod["spec"]
    for c in [*spec.get("initContainers", []), *spec["containers"]]:
        env = {e["name"]: e["value"] for e in c.get("env") or [] if "value" in e}
        if "GANGJOB_ARRIVAL_URL" in env:
            return env
    raise AssertionError(f"no agent in {pod['metadata']['name']}")


# From a pod, as an agent would: a TLS client trusting the CA handed to the pods verifies the
# endpoint (and sees the certificate the Secret holds); one trusting another CA is refused
# before it sends anything; a plain-HTTP request is answered no HTTP at all.
TLS_PROBE = r"""
import hashlib, os, socket, ssl
host, port = os.environ["HOST"], 8082
ok = ssl.create_default_context(cadata=os.environ["CA"])
with socket.create_connection((host, port), timeout=10) as raw:
    with ok.wrap_socket(raw, server_hostname=host) as s:
        print("verified", hashlib.sha256(s.getpeercert(binary_form=True)).hexdigest())
wrong = ssl.create_default_context(cadata=os.environ["WRONG_CA"])
try:
    with socket.create_connection((host, port), timeout=10) as raw:
        wrong.wrap_socket(raw, server_hostname=host)
    print("wrong CA: accepted")
except ssl.SSLCertVerificationError as e:
    print("wrong CA: refused", e.verify_message)
with socket.create_connection((host, port), timeout=10) as s:
    s.sendall(b"POST /v1/arrivals HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\n"
              b"Content-Length: 2\r\n\r\n{}")
    answer = b""
    while chunk := s.recv(4096):
        answer += chunk
print("plain HTTP answered:", repr(answer[:16]))
"""


async def _probe_tls(
    kube: Kube, cluster: Cluster, ns: str, name: str, tls: dict[str, bytes]
) -> None:
    wrong_ca = certs.make_ca(datetime.datetime.now(datetime.UTC))[0].decode()
    env = {"HOST": f"gangjob-arrivals.{SYSTEM_NS}.svc", "CA": tls["ca.crt"].decode(),
           "WRONG_CA": wrong_ca}  # fmt: skip
    body: dict[str, Any] = {
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "probe",
                    "image": node.AGENT_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/usr/bin/python3", "-c", TLS_PROBE],
                    "env": [{"name": k, "value": v} for k, v in env.items()],
                }
            ],
        },
    }
    await kube.create(PODS, body, ns)
    done = await wait_for(
        kube, PODS, name, ns,
        lambda p: p.get("status", {}).get("phase") in ("Succeeded", "Failed"), 90, "finished",
    )  # fmt: skip
    log = kubectl(cluster, "-n", ns, "logs", name)
    print(log)
    assert done["status"]["phase"] == "Succeeded", log
    served = x509.load_pem_x509_certificate(tls["tls.crt"]).public_bytes(Encoding.DER)
    assert f"verified {hashlib.sha256(served).hexdigest()}" in log
    assert "wrong CA: refused" in log
    (answered,) = [line for line in log.splitlines() if line.startswith("plain HTTP answered:")]
    assert "HTTP/" not in answered, answered


SCRAPE = r"""
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=10) as resp:
    print(resp.read().decode())
"""


async def _scrape_through_service(kube: Kube, cluster: Cluster, ns: str) -> None:
    url = f"http://gangjob-controller-metrics.{SYSTEM_NS}.svc:8080/metrics"
    body: dict[str, Any] = {
        "metadata": {"name": "scrape"},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "scrape",
                    "image": node.AGENT_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/usr/bin/python3", "-c", SCRAPE, url],
                }
            ],
        },
    }
    await kube.create(PODS, body, ns)
    done = await wait_for(
        kube, PODS, "scrape", ns,
        lambda p: p.get("status", {}).get("phase") in ("Succeeded", "Failed"), 90, "finished",
    )  # fmt: skip
    log = kubectl(cluster, "-n", ns, "logs", "scrape")
    assert done["status"]["phase"] == "Succeeded", log
    assert "# TYPE gangjob_arrival_reports_total counter" in log
    assert "leader_election_master_status" in log


# A real Prometheus (localcluster.prometheus) in a pod, as a platform team runs it, finding the
# controller's replicas through its Service gangjob-controller-metrics (headless: the cluster DNS
# names every ready replica) and scraping each. The pod runs the cached binary from a hostPath
# on the agent image, which has the C library it links; the test queries it at its pod address.
# (Debian's Prometheus has no Kubernetes service discovery, which a ServiceMonitor would use.)
PROMETHEUS_CONFIG = f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
scrape_configs:
- job_name: gangjob-controller
  dns_sd_configs:
  - names: [gangjob-controller-metrics.{SYSTEM_NS}.svc.cluster.local]
    type: A
    port: 8080
    refresh_interval: 2s
"""
PROMETHEUS_PORT = 9090


@pytest.fixture
async def prometheus_server(
    node_kube: Kube, node_cluster: Cluster, node_namespace: str
) -> AsyncIterator[str]:
    """The Prometheus pod; yields its URL, deletes it afterwards."""
    ns, home = node_namespace, prometheus.ensure_built()
    await node_kube.create(CONFIGMAPS, {
        "metadata": {"name": "prometheus"}, "data": {"prometheus.yml": PROMETHEUS_CONFIG},
    }, ns)  # fmt: skip
    container = {
        "name": "prometheus",
        "image": node.AGENT_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["/prometheus/prometheus", "--config.file=/config/prometheus.yml",
                    "--storage.tsdb.path=/data", f"--web.listen-address=:{PROMETHEUS_PORT}"],
        "volumeMounts": [
            {"name": "binary", "mountPath": "/prometheus", "readOnly": True},
            {"name": "config", "mountPath": "/config", "readOnly": True},
            {"name": "data", "mountPath": "/data"},
        ],
    }  # fmt: skip
    pod = {
        "metadata": {"name": "prometheus"},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "containers": [container],
            "volumes": [
                {"name": "binary", "hostPath": {"path": str(home), "type": "Directory"}},
                {"name": "config", "configMap": {"name": "prometheus"}},
                {"name": "data", "emptyDir": {}},
            ],
        },
    }
    await node_kube.create(PODS, pod, ns)
    try:
        running = await wait_for(
            node_kube, PODS, "prometheus", ns,
            lambda p: bool(p.get("status", {}).get("podIP"))
            and p.get("status", {}).get("phase") == "Running",
            120, "running",
        )  # fmt: skip
        yield f"http://{running['status']['podIP']}:{PROMETHEUS_PORT}"
    finally:
        with contextlib.suppress(RuntimeError):
            print(kubectl(node_cluster, "-n", ns, "logs", "prometheus")[-3000:])
        await node_kube.delete(PODS, "prometheus", ns)


def promql(url: str, query: str) -> list[dict[str, Any]]:
    """An instant query's result vector (empty while Prometheus has nothing, or is starting)."""
    try:
        with urllib.request.urlopen(
            f"{url}/api/v1/query?{urllib.parse.urlencode({'query': query})}", timeout=10
        ) as resp:
            body = json.load(resp)
    except (urllib.error.URLError, ConnectionError) as e:
        print(f"query {query}: {e}")
        return []
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


async def test_prometheus_scrapes_the_restart_through_the_service(
    node_kube: Kube, node_namespace: str, node_cluster: Cluster, in_cluster: None,
    prometheus_server: str,
) -> None:  # fmt: skip
    ns = node_namespace
    kubectl(node_cluster, "-n", SYSTEM_NS, "rollout", "status", f"deployment/{DEPLOYMENT}",
            "--timeout=180s", timeout=200)  # fmt: skip
    await eventually(lambda: two_ready_one_leader(node_kube), 120, "two Ready replicas")

    async def target_up() -> list[dict[str, Any]] | None:
        up = await asyncio.to_thread(promql, prometheus_server, 'up{job="gangjob-controller"}')
        return up if len(up) == 2 and all(s["value"][1] == "1" for s in up) else None

    up = await eventually(target_up, 60, "both replicas scraped")
    print("scraped:", sorted(s["metric"]["instance"] for s in up))

    # Rank 1 crashes once (TRAINER): one gang restart, in place, to epoch 1.
    await node_kube.create(GANGJOBS, gangjob("scraped"), ns)
    await watch_job(node_kube, ns, "scraped", at_epoch(1), timeout=180, what="at epoch 1")

    epoch = f'gangjob_epoch{{namespace="{ns}",name="scraped"}} == 1'
    found = await eventually(
        lambda: _nonempty(asyncio.to_thread(promql, prometheus_server, epoch)), 30,
        "the job's epoch 1 in Prometheus",
    )  # fmt: skip
    print("query", epoch, "->", found)
    restarts = 'sum(gangjob_restarts_total{class="ProcessExit",action="RestartGang"})'
    got = await eventually(
        lambda: _nonempty(asyncio.to_thread(promql, prometheus_server, restarts)), 30,
        "the ProcessExit restart in Prometheus",
    )  # fmt: skip
    print("query", restarts, "->", got)
    assert float(got[0]["value"][1]) >= 1
    barrier = f'gangjob_barrier_epoch{{namespace="{ns}",name="scraped"}}'
    opened = await eventually(
        lambda: _nonempty(asyncio.to_thread(promql, prometheus_server, f"{barrier} == 1")), 30,
        "the barrier of epoch 1 in Prometheus",
    )  # fmt: skip
    # Both series come from the leader, one of the two replicas scraped.
    assert opened[0]["metric"]["instance"] == found[0]["metric"]["instance"]
    assert found[0]["metric"]["instance"] in {s["metric"]["instance"] for s in up}
    await node_kube.delete(GANGJOBS, "scraped", ns)


async def _nonempty(got: Awaitable[list[dict[str, Any]]]) -> list[dict[str, Any]] | None:
    value = await got
    return value or None
