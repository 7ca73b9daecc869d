"""ClusterIP Services on the real node: kube-proxy (localcluster.proxy) routes a Service's address
to its ready pod, by name through the cluster DNS and by address, from another pod."""

from __future__ import annotations

import json
import uuid

import pytest

from controller.k8s import PODS, SERVICES, JsonDict, Kube
from localcluster import proxy
from localcluster.cluster import Cluster
from localcluster.node import AGENT_IMAGE
from localcluster.tools import kubectl
from tests.waiting import wait_for

pytestmark = pytest.mark.e2e

# Polls (with a deadline) until the Service answers: kube-proxy programs it a moment after the
# endpoint turns ready. Prints what each address answered and who the server saw calling.
FETCH = r"""
import json, sys, time, urllib.request
out = {}
for url in sys.argv[1:]:
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(url, timeout=3) as resp:
                out[url] = resp.read().decode().strip()
            break
        except OSError as e:
            if time.monotonic() > deadline:
                out[url] = "error: %s" % e
                break
            time.sleep(0.5)
print(json.dumps(out))
"""

# The server answers its token and the caller's address.
SERVE = r"""
import http.server, os
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("%s %s" % (os.environ["TOKEN"], self.client_address[0])).encode()
        self.send_response(200); self.end_headers(); self.wfile.write(body)
http.server.HTTPServer(("", 8080), H).serve_forever()
"""


def pod(name: str, labels: dict[str, str], command: list[str], **extra: str) -> JsonDict:
    container: JsonDict = {
        "name": "main",
        "image": AGENT_IMAGE,
        "imagePullPolicy": "Never",
        "command": command,
        "env": [{"name": k, "value": v} for k, v in extra.items()],
    }
    if labels:  # a Service's pod: ready once it listens
        container["readinessProbe"] = {"tcpSocket": {"port": 8080}, "periodSeconds": 1}
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [container],
        },
    }


async def test_a_cluster_ip_service_reaches_its_pod(
    node_kube: Kube, node_namespace: str, node_cluster: Cluster
) -> None:
    ns = node_namespace
    token = uuid.uuid4().hex
    server = pod("web-0", {"app": "web"}, ["/usr/bin/python3", "-c", SERVE], TOKEN=token)
    await node_kube.create(PODS, server, ns)
    svc = await node_kube.create(
        SERVICES,
        {
            "metadata": {"name": "web"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
        },
        ns,
    )
    cluster_ip = svc["spec"]["clusterIP"]
    assert cluster_ip.startswith(node_cluster.service_cidr.rsplit(".", 2)[0])
    await wait_for(
        node_kube, PODS, "web-0", ns,
        lambda p: any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in p.get("status", {}).get("conditions", [])
        ),
        90, "Ready",
    )  # fmt: skip
    urls = [f"http://web.{ns}.svc.cluster.local/", f"http://{cluster_ip}/"]
    client = pod("client", {}, ["/usr/bin/python3", "-c", FETCH, *urls])
    await node_kube.create(PODS, client, ns)
    done = await wait_for(
        node_kube, PODS, "client", ns,
        lambda p: p.get("status", {}).get("phase") in ("Succeeded", "Failed"), 120, "finished",
    )  # fmt: skip
    log = kubectl(node_cluster, "-n", ns, "logs", "client")
    assert done["status"]["phase"] == "Succeeded", log
    got = json.loads(log.strip().splitlines()[-1])
    # The answer came from the pod behind the Service, which saw the call come from kube-proxy's
    # namespace (masqueraded, so that the answer returns through it).
    assert got == {url: f"{token} {proxy.router_ip(node_cluster)}" for url in urls}, got
