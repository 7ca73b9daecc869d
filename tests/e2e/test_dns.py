"""Cluster DNS on the real node: a pod resolves its headless Service's `<hostname>.<subdomain>`
through the search path, as MASTER_ADDR does, and nothing off the cluster."""

from __future__ import annotations

import json

import pytest

from controller.k8s import PODS, SERVICES, Kube
from localcluster.cluster import Cluster
from localcluster.node import AGENT_IMAGE
from localcluster.tools import kubectl
from tests.waiting import wait_for

pytestmark = pytest.mark.e2e

# glibc's resolver (getaddrinfo, what torch's TCPStore uses), through the pod's resolv.conf.
RESOLVE = r"""
import json, socket
def a(name):
    try:
        return sorted({ai[4][0] for ai in socket.getaddrinfo(name, 80, socket.AF_INET)})
    except socket.gaierror as e:
        return "error: %s" % e.strerror
names = ["w-0.w", "w", "kubernetes.default", "w-1.w", "pypi.org"]
print(json.dumps({n: a(n) for n in names}))
print(json.dumps({"self": socket.gethostbyname(socket.gethostname())}))
"""


async def test_a_pod_resolves_its_peers_by_hostname_and_subdomain(
    node_kube: Kube, node_namespace: str, node_cluster: Cluster
) -> None:
    ns = node_namespace
    await node_kube.create(
        SERVICES,
        {
            "metadata": {"name": "w"},
            "spec": {
                "clusterIP": "None",
                "selector": {"app": "w"},
                "publishNotReadyAddresses": True,
            },
        },
        ns,
    )
    await node_kube.create(
        PODS,
        {
            "metadata": {"name": "w-0", "labels": {"app": "w"}},
            "spec": {
                "hostname": "w-0",
                "subdomain": "w",
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 0,
                "containers": [
                    {
                        "name": "resolve",
                        "image": AGENT_IMAGE,
                        "imagePullPolicy": "Never",
                        "command": ["/usr/bin/python3", "-c", RESOLVE],
                    }
                ],
            },
        },
        ns,
    )
    pod = await wait_for(
        node_kube, PODS, "w-0", ns,
        lambda p: p.get("status", {}).get("phase") in ("Succeeded", "Failed"), 90, "finished",
    )  # fmt: skip
    log = kubectl(node_cluster, "-n", ns, "logs", "w-0")
    assert pod["status"]["phase"] == "Succeeded", log
    lines = log.strip().splitlines()
    got = json.loads(lines[0])
    ip = pod["status"]["podIP"]
    assert got["w-0.w"] == [ip]
    assert got["w"] == [ip]
    assert got["kubernetes.default"] == [node_cluster.service_ip]
    assert str(got["w-1.w"]).startswith("error")
    assert str(got["pypi.org"]).startswith("error")  # nothing is forwarded off the machine
    resolv = kubectl(
        node_cluster, "-n", ns, "get", "pod", "w-0", "-o", "jsonpath={.spec.dnsPolicy}"
    )
    assert resolv == "ClusterFirst"
