"""ClusterIP Services on the `node` profile: kube-proxy in a network namespace of its own.

kube-proxy programs the netfilter rules of the network namespace it runs in, with chain and
table names that are fixed (`KUBE-SERVICES`, ...): two kube-proxies in one namespace delete each
other's rules. This machine runs several clusters side by side, so each cluster's kube-proxy runs
in a namespace of its own, ``gjsvc<slot>``, that acts as the pods' router to the Service range:

- a veth pair joins the namespace to the cluster's bridge, with the address `router_ip`
  (``10.(80+s).0.2``, kept out of the pods' IPAM range);
- the pods route the Service range to it (`pod_routes`), except the `kubernetes` Service and
  the cluster DNS, which live on the bridge itself (`localcluster.forward`, `localcluster.dns`);
- in the namespace, kube-proxy (iptables mode, `masqueradeAll`) DNATs a Service's address to one
  of its ready endpoints and SNATs to `router_ip`, so the answer comes back through it; the
  namespace forwards (its own `ip_forward`: the host's is left alone);
- kube-proxy reaches the apiserver the in-cluster way, through the `kubernetes` Service address
  on the bridge, as ``system:kube-proxy`` (bound by the bootstrap `system:node-proxier`).

The `kubernetes` and `kube-dns` Services carry `SERVICE_PROXY_NAME_LABEL`, which kube-proxy skips:
they have no endpoints (this host serves them), and kube-proxy would answer them with REJECT.
`down` deletes the namespace, which takes the veth pair and every rule with it.
"""

from __future__ import annotations

import contextlib
import subprocess
import urllib.error
import urllib.request
from typing import TextIO

from localcluster import pki
from localcluster.handle import ClusterHandle
from localcluster.versions import binary

SERVICE_PROXY_NAME_LABEL = "service.kubernetes.io/service-proxy-name"
"""kube-proxy ignores a Service with this label: the ones localcluster serves itself."""
SERVED_BY = "localcluster"
HEALTHZ_PORT = 10256  # kube-proxy's defaults, on the namespace's own address
METRICS_PORT = 10249
KUBECONFIG_USER = "system:kube-proxy"  # its client certificate: pki.client_identities


class ProxyError(RuntimeError):
    """The Service proxy could not be set up; the message says why."""


def netns(cluster: ClusterHandle) -> str:
    return f"gjsvc{cluster.ports.slot}"


def router_ip(cluster: ClusterHandle) -> str:
    """The namespace's address on the pod bridge: the pods' next hop to the Service range."""
    return f"10.{80 + cluster.ports.slot}.0.2"


def first_pod_ip(cluster: ClusterHandle) -> str:
    """Where the pods' IPAM range starts: past the gateway (.1) and `router_ip` (.2)."""
    return f"10.{80 + cluster.ports.slot}.0.10"


def pod_routes(cluster: ClusterHandle, gateway: str, dns_ip: str) -> list[dict[str, str]]:
    """The pods' routes: the Service range to kube-proxy's namespace, the two Services this host
    serves (more specific) to the bridge's gateway."""
    return [
        {"dst": f"{cluster.service_ip}/32", "gw": gateway},
        {"dst": f"{dns_ip}/32", "gw": gateway},
        {"dst": cluster.service_cidr, "gw": router_ip(cluster)},
    ]


def _run(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(cmd, capture_output=True, text=True)
    if check and res.returncode != 0:
        raise ProxyError(f"`{' '.join(cmd)}` failed ({res.returncode}): {res.stderr.strip()}")
    return res


def setup_netns(cluster: ClusterHandle, bridge: str, gateway: str, prefix: str) -> None:
    """The namespace, its veth on `bridge`, its address, routes and forwarding."""
    ns = netns(cluster)
    host_end, ns_end = f"{ns}h", f"{ns}n"
    if _run(["ip", "netns", "exec", ns, "true"], check=False).returncode != 0:
        _run(["ip", "netns", "add", ns])
    if _run(["ip", "link", "show", host_end], check=False).returncode != 0:
        _run(["ip", "link", "add", host_end, "type", "veth", "peer", "name", ns_end])
        _run(["ip", "link", "set", ns_end, "netns", ns])
    _run(["ip", "link", "set", host_end, "master", bridge, "up"])
    inside = ["ip", "netns", "exec", ns]
    _run([*inside, "ip", "link", "set", "lo", "up"])
    _run([*inside, "ip", "addr", "replace", f"{router_ip(cluster)}/{prefix}", "dev", ns_end])
    _run([*inside, "ip", "link", "set", ns_end, "up"])
    # kube-proxy's own way to the apiserver: the `kubernetes` Service address on the bridge.
    _run([*inside, "ip", "route", "replace", f"{cluster.service_ip}/32", "via", gateway])
    _run([*inside, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])
    # Pods and endpoints share one link: without this the namespace would tell every client to
    # reach the endpoint directly (ICMP redirects), which a Service address must not do.
    for conf in ("all", "default", ns_end):
        _run([*inside, "sysctl", "-q", "-w", f"net.ipv4.conf.{conf}.send_redirects=0"])


def delete_netns(name: str) -> None:
    """Removes a namespace `setup_netns` made (its veth pair and rules go with it)."""
    _run(["ip", "netns", "delete", name], check=False)


def kube_proxy_args(cluster: ClusterHandle, node_name: str, gates: dict[str, bool]) -> list[str]:
    """kube-proxy's settings as flags, not a --config file: with a file it holds an inotify
    instance to watch it, and a machine running several clusters has few left (the default
    limit is 128 per user; kube-proxy failed to start with "too many open files")."""
    ip = router_ip(cluster)
    args = [
        f"--kubeconfig={cluster.dir / 'kube-proxy.kubeconfig'}",
        f"--hostname-override={node_name}",
        f"--bind-address={ip}",
        f"--healthz-bind-address={ip}:{HEALTHZ_PORT}",
        f"--metrics-bind-address={ip}:{METRICS_PORT}",
        "--proxy-mode=iptables",
        # Client and endpoint share the bridge: SNAT makes the answer come back through here.
        "--masquerade-all",
        "--iptables-localhost-nodeports=false",
        f"--nodeport-addresses={ip}/32",
        # conntrack: leave the kernel's settings (the namespace cannot change most of them).
        "--conntrack-max-per-core=0",
        "--conntrack-min=0",
        "--conntrack-tcp-timeout-established=0s",
        "--conntrack-tcp-timeout-close-wait=0s",
        "--v=1",
    ]
    if gates:
        pairs = (f"{k}={'true' if v else 'false'}" for k, v in sorted(gates.items()))
        args.append("--feature-gates=" + ",".join(pairs))
    return args


def mark_served_by_host(cluster: ClusterHandle, namespace: str, name: str) -> None:
    """Labels a Service that this host serves, so that kube-proxy leaves it alone."""
    body = {"metadata": {"labels": {SERVICE_PROXY_NAME_LABEL: SERVED_BY}}}
    cluster.api("PATCH", f"/api/v1/namespaces/{namespace}/services/{name}", body)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def start(
    cluster: ClusterHandle,
    bridge: str,
    gateway: str,
    prefix: str,
    node_name: str,
    gates: dict[str, bool],
    out: TextIO,
) -> None:
    """Sets up the namespace and starts kube-proxy in it; returns once it has synced."""
    mark_served_by_host(cluster, "default", "kubernetes")
    state = cluster.load()
    state.setdefault("host", {})["proxy_netns"] = netns(cluster)
    cluster.save(state)
    setup_netns(cluster, bridge, gateway, prefix)
    pki.write_kubeconfig(
        cluster.dir / "kube-proxy.kubeconfig",
        cluster.pki,
        f"https://{cluster.service_ip}:443",
        "kube-proxy",
        KUBECONFIG_USER,
    )
    out.write(f"starting kube-proxy (namespace {netns(cluster)}, {router_ip(cluster)})\n")
    cluster.launch(
        "kube-proxy",
        [
            "ip", "netns", "exec", netns(cluster), str(binary("kube-proxy").path),
            *kube_proxy_args(cluster, node_name, gates),
        ],
    )  # fmt: skip
    url = f"http://{router_ip(cluster)}:{HEALTHZ_PORT}/healthz"
    cluster.wait_for("kube-proxy", lambda: _healthy(url), 60, "kube-proxy", out)


def remove(cluster: ClusterHandle) -> None:
    """What `down` does once kube-proxy stopped: the namespace goes, veth and rules with it."""
    name = cluster.load().get("host", {}).get("proxy_netns")
    if name:
        with contextlib.suppress(ProxyError):
            delete_netns(name)
