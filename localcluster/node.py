"""The `node` profile: one real kubelet with containerd, runc and CNI on this machine.

Everything it creates is named after the cluster and recorded in its ``cluster.json`` so that
``down`` removes exactly that: a Linux bridge for the pod network (no default route and no
masquerade in pods, so nothing leaves the machine), containerd with its own root, state and
socket, the kubelet with its own root dir and cgroup root, kube-proxy in a network namespace
of its own (`localcluster.proxy`), and the images it imports. The measured facts behind the
settings are in docs/localcluster.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml

from agent.build import build_zipapp
from localcluster import controllerimage, dns, images, proxy, pytorch
from localcluster.handle import ClusterHandle
from localcluster.versions import binary, cache_root

NODE_NAME = "gangjob-node"
CNI_BIN = Path("/usr/lib/cni")
# Debian package -> a file that shows it is installed.
PACKAGES = {
    "containerd": Path("/usr/bin/containerd"),
    "runc": Path("/usr/sbin/runc"),
    "containernetworking-plugins": CNI_BIN / "bridge",
    "busybox-static": Path("/bin/busybox"),
    "iproute2": Path("/usr/sbin/ip"),
    "python3.11": images.PYTHON,  # Debian's interpreter and stdlib, copied into the images
}


class NodeError(RuntimeError):
    """The real node could not be set up; the message says why."""


@dataclass(frozen=True)
class Bridge:
    """The pod network of one cluster: a bridge and a /16 that exist only on this machine."""

    name: str
    subnet: str
    gateway: str

    @property
    def mac(self) -> str:
        """Fixed and locally administered: 0a:58 and the gateway's IPv4 bytes (as kubenet)."""
        return "0a:58:" + ":".join(f"{int(b):02x}" for b in self.gateway.split("."))

    @staticmethod
    def for_slot(slot: int) -> Bridge:
        return Bridge(f"gjbr{slot}", f"10.{80 + slot}.0.0/16", f"10.{80 + slot}.0.1")


def _run(cmd: list[str], check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if check and res.returncode != 0:
        raise NodeError(f"`{' '.join(cmd)}` failed ({res.returncode}): {res.stderr.strip()}")
    return res


def ensure_packages(out: TextIO) -> None:
    """Installs the Debian packages a real node needs, when missing."""
    if os.geteuid() != 0:
        raise NodeError("the node profile runs containerd and a kubelet: it needs root")
    missing = [pkg for pkg, path in PACKAGES.items() if not path.exists()]
    if not missing:
        return
    out.write(f"installing Debian packages: {' '.join(missing)}\n")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    # Keep the packages' own service scripts from starting a system containerd.
    policy = Path("/usr/sbin/policy-rc.d")
    had_policy = policy.exists()
    if not had_policy:
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    try:
        _run(["apt-get", "update", "-q"], env=env)
        _run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing], env=env)
    finally:
        if not had_policy:
            policy.unlink(missing_ok=True)
    still = [pkg for pkg, path in PACKAGES.items() if not path.exists()]
    if still:
        raise NodeError(f"packages still missing after apt-get install: {still}")


# ---- images ------------------------------------------------------------------------------
AGENT_IMAGE = "localhost/gangjob-agent:dev"
AGENT_PYZ = "opt/gangjob/agent.pyz"  # where the agent image keeps the zipapp


def agent_image() -> images.ImageSpec:
    """Python 3 and the agent zipapp: the Pod-mode sidecar, and the init container that copies
    the agent into a worker for Process mode. The zipapp is built fresh from this checkout."""
    pyz = build_zipapp(cache_root() / "images" / "agent.pyz")
    spec = images.python_image(AGENT_IMAGE, {AGENT_PYZ: pyz})
    spec.entrypoint = ["/usr/bin/python3", f"/{AGENT_PYZ}"]
    spec.cmd = ["sidecar"]
    return spec


def image_specs() -> list[images.ImageSpec]:
    """The images every node gets: the controller's too, for manifests/local."""
    return [
        images.pause_image(),
        images.busybox_image(),
        agent_image(),
        controllerimage.controller_image(),
    ]


def import_images(cluster: ClusterHandle, out: TextIO) -> None:
    for spec in image_specs():
        import_image(cluster, spec, out)


def import_image(cluster: ClusterHandle, spec: images.ImageSpec, out: TextIO) -> None:
    """Writes ``spec``'s archive (skipped when cached) and imports it into the node, unless
    the node has this very build already (recorded in cluster.json by fingerprint)."""
    archive = images.write_oci_archive(spec, images.archive_path(spec))
    fp = archive.with_suffix(".fingerprint").read_text()
    state = cluster.load()
    if state.get("images", {}).get(spec.name) == fp:
        return
    t0 = time.monotonic()
    ctr = ["ctr", "--address", str(containerd_sock(cluster)), "--namespace", "k8s.io"]
    # Unpacked at import for the snapshotter the CRI uses, so that the first container starts
    # at once: containerd 1.6's ctr has no `images unpack`, and a first CreateContainer that
    # unpacks the trainer image's 600 MB took 45 s on a loaded machine.
    _run([*ctr, "images", "import", "--snapshotter", "overlayfs", str(archive)], timeout=600)
    state = cluster.load()
    state.setdefault("images", {})[spec.name] = fp
    cluster.save(state)
    mb = archive.stat().st_size >> 20
    out.write(f"  imported {spec.name} ({mb} MB, {time.monotonic() - t0:.1f}s)\n")


def ensure_trainer_image(cluster: ClusterHandle, out: TextIO) -> str:
    """The PyTorch trainer image on the node, built and imported on first use (not by `up`:
    its first build installs PyTorch, minutes; later ones are cached)."""
    import_image(cluster, pytorch.trainer_image(out), out)
    return pytorch.PYTORCH_IMAGE


# ---- host network ------------------------------------------------------------------------
def _ip_forward() -> str:
    return Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()


def dns_ip(cluster: ClusterHandle) -> str:
    """The cluster DNS address (kube-dns's usual `.10` of the service range)."""
    return cluster.service_ip.rsplit(".", 1)[0] + ".10"


def setup_bridge(bridge: Bridge, service_ip: str, dns: str) -> None:
    """The bridge holds the pods' gateway, the `kubernetes` Service IP and the cluster DNS IP
    (as /32s), so a pod's packets to them reach this host's forwarder and DNS server without
    any NAT."""
    if _run(["ip", "link", "show", bridge.name], check=False).returncode != 0:
        _run(["ip", "link", "add", bridge.name, "type", "bridge"])
    # A bridge whose MAC was never set takes the lowest MAC of its ports. When the pod whose
    # veth holds it is deleted, every pod that resolved the gateway to that MAC loses this host
    # (apiserver forwarder, DNS, controller) until its neighbour entry expires: 10-40 s of
    # unanswered requests. The CNI plugin pins it only when it sets the gateway itself.
    _run(["ip", "link", "set", bridge.name, "address", bridge.mac])
    prefix = bridge.subnet.split("/")[1]
    addrs = _run(["ip", "-4", "addr", "show", "dev", bridge.name]).stdout
    for cidr in (f"{bridge.gateway}/{prefix}", f"{service_ip}/32", f"{dns}/32"):
        if f"{cidr.split('/')[0]}/" not in addrs:
            _run(["ip", "addr", "add", cidr, "dev", bridge.name])
    _run(["ip", "link", "set", bridge.name, "up"])


def cni_config(cluster: ClusterHandle, bridge: Bridge) -> dict[str, Any]:
    return {
        "cniVersion": "0.4.0",
        "name": f"gangjob-{cluster.name}",
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge.name,
                # The bridge already has the gateway address (we set it); leaving the plugin
                # out of the gateway business also keeps it from switching on ip_forward.
                "isGateway": False,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [
                        [
                            {
                                "subnet": bridge.subnet,
                                "gateway": bridge.gateway,
                                "rangeStart": proxy.first_pod_ip(cluster),
                            }
                        ]
                    ],
                    # No default route: nothing leaves the machine. Only the service range:
                    # through kube-proxy's namespace, but for the `kubernetes` and DNS addresses
                    # that live on the bridge (see setup_bridge).
                    "routes": proxy.pod_routes(cluster, bridge.gateway, dns_ip(cluster)),
                    "dataDir": str(cluster.dir / "cni" / "ipam"),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}, "snat": False},
        ],
    }


# ---- containerd --------------------------------------------------------------------------
def containerd_config(cluster: ClusterHandle) -> str:
    d = cluster.dir / "containerd"
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{d / "root"}"
state = "{d / "state"}"
oom_score = 0
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{d / "containerd.sock"}"

[ttrpc]
  address = "{d / "containerd.sock.ttrpc"}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d / "opt"}"

[{cri}]
  sandbox_image = "localhost/pause:dev"
  # root here lacks CAP_SYS_RESOURCE: don't try to lower the OOM score of containers.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "{cluster.ports.containerd_stream}"
  enable_selinux = false
  max_container_log_line_size = 16384

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  # PID 1 is not systemd here: cgroupfs, as the kubelet is told too.
  SystemdCgroup = false

[{cri}.cni]
  bin_dir = "{CNI_BIN}"
  conf_dir = "{cluster.dir / "cni" / "net.d"}"
"""


def containerd_sock(cluster: ClusterHandle) -> Path:
    return cluster.dir / "containerd" / "containerd.sock"


# ---- kubelet -----------------------------------------------------------------------------
def cgroup_root(cluster: ClusterHandle) -> str:
    return f"/gangjob-{cluster.name}"


def kubelet_config(
    cluster: ClusterHandle, bridge: Bridge, gates: dict[str, bool]
) -> dict[str, Any]:
    k = cluster.pki
    cfg: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": bridge.gateway,
        "port": cluster.ports.kubelet,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": cluster.ports.kubelet_healthz,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(k / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "tlsCertFile": str(k / "kubelet-serving.crt"),
        "tlsPrivateKeyFile": str(k / "kubelet-serving.key"),
        "containerRuntimeEndpoint": f"unix://{containerd_sock(cluster)}",
        "cgroupDriver": "cgroupfs",
        # Every pod of this cluster lives under one cgroup: `down` finds its leftovers there.
        "cgroupRoot": cgroup_root(cluster),
        "failCgroupV1": False,
        "failSwapOn": False,
        "makeIPTablesUtilChains": False,
        # Local images cannot be pulled again: never garbage-collect them.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "podLogsDir": str(cluster.dir / "pod-logs"),
        "clusterDomain": "cluster.local",
        # localcluster.dns: pods resolve Services and `<hostname>.<subdomain>` as in a cluster.
        "clusterDNS": [dns_ip(cluster)],
        "serializeImagePulls": False,
        "registerNode": True,
        "protectKernelDefaults": False,
        "localStorageCapacityIsolation": True,
    }
    if gates:
        cfg["featureGates"] = gates
    return cfg


def make_cgroup_root(root: str) -> None:
    """The kubelet wants its cgroup root to exist in every v1 hierarchy before it starts."""
    base = Path("/sys/fs/cgroup")
    for h in base.iterdir():
        if not (h / "cgroup.procs").exists():
            continue
        d = h / root.lstrip("/")
        d.mkdir(exist_ok=True)
        if h.name.startswith("cpuset"):
            # A new v1 cpuset has no CPUs and no memory nodes until given its parent's.
            for f in ("cpuset.cpus", "cpuset.mems"):
                if not (d / f).read_text().strip():
                    (d / f).write_text((h / f).read_text())


def start_node(cluster: ClusterHandle, bridge: Bridge, gates: dict[str, bool], out: TextIO) -> None:
    """Sets up the host (packages, cgroup root, bridge, CNI), then starts containerd with the
    images imported, the apiserver forwarder, the cluster DNS and the kubelet, and waits for
    the node to be Ready. ``gates``: the feature gates the control plane was given."""
    ensure_packages(out)
    state = cluster.load()
    host = state.setdefault("host", {})
    host["ip_forward"] = _ip_forward()
    host["bridge"] = bridge.name
    host["cgroup_root"] = cgroup_root(cluster)
    # containerd makes /var/run/netns for pod network namespaces; remove it after if it was new.
    host["netns_dir_existed"] = Path("/var/run/netns").exists()
    cluster.save(state)
    make_cgroup_root(cgroup_root(cluster))
    setup_bridge(bridge, cluster.service_ip, dns_ip(cluster))
    netd = cluster.dir / "cni" / "net.d"
    netd.mkdir(parents=True, exist_ok=True)
    (netd / "10-gangjob.conflist").write_text(json.dumps(cni_config(cluster, bridge), indent=2))

    cd = cluster.dir / "containerd"
    cd.mkdir(parents=True, exist_ok=True)
    (cd / "config.toml").write_text(containerd_config(cluster))
    out.write("starting containerd\n")
    env = dict(os.environ, PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    cluster.launch("containerd", ["containerd", "--config", str(cd / "config.toml")], env=env)
    sock = containerd_sock(cluster)
    ctr = ["ctr", "--address", str(sock), "version"]
    cluster.wait_for("containerd", lambda: _run(ctr, check=False).returncode == 0, 30, "containerd")
    import_images(cluster, out)
    # Pods talk to the apiserver the in-cluster way: the Service IP on the bridge, forwarded.
    cluster.launch(
        "apiserver-forward",
        [
            sys.executable,
            "-m",
            "localcluster.forward",
            f"--listen={cluster.service_ip}:443",
            f"--connect=127.0.0.1:{cluster.ports.apiserver}",
        ],
    )
    start_dns(cluster)

    kdir = cluster.dir / "kubelet"
    kdir.mkdir(parents=True, exist_ok=True)
    (cluster.dir / "kubelet-config.yaml").write_text(
        yaml.safe_dump(kubelet_config(cluster, bridge, gates), sort_keys=False)
    )
    out.write(f"starting kubelet (node {NODE_NAME}, {bridge.gateway})\n")
    cluster.launch(
        "kubelet",
        [
            str(binary("kubelet").path),
            f"--config={cluster.dir / 'kubelet-config.yaml'}",
            f"--kubeconfig={cluster.dir / 'kubelet.kubeconfig'}",
            f"--root-dir={kdir}",
            f"--cert-dir={kdir / 'pki'}",
            f"--node-ip={bridge.gateway}",
            f"--hostname-override={NODE_NAME}",
            "--v=1",
        ],
        env=env,
    )
    cluster.wait_for("the node to be Ready", lambda: cluster.ready_nodes() >= 1, 90, "kubelet", out)
    # After the node exists: kube-proxy reads its Node object when it starts.
    proxy.start(
        cluster, bridge.name, bridge.gateway, bridge.subnet.split("/")[1], NODE_NAME, gates, out
    )


def start_dns(cluster: ClusterHandle) -> None:
    """localcluster.dns on the DNS address, which a `kube-dns` Service reserves so that the
    apiserver never hands it to another Service."""
    ip = dns_ip(cluster)
    with contextlib.suppress(urllib.error.HTTPError):  # 409: there already
        cluster.api("POST", "/api/v1/namespaces/kube-system/services", kube_dns_service(ip))
    k = cluster.pki
    cluster.launch(
        "cluster-dns",
        [
            sys.executable, "-m", "localcluster.dns", f"--listen={ip}:53",
            f"--server={cluster.server}", f"--ca={k / 'ca.crt'}",
            f"--cert={k / 'admin.crt'}", f"--key={k / 'admin.key'}",
        ],
    )  # fmt: skip
    want = f"kubernetes.default.svc.{dns.CLUSTER_DOMAIN}"
    cluster.wait_for(
        "cluster DNS", lambda: dns.resolve(ip, want) == [cluster.service_ip], 30, "cluster-dns"
    )


def kube_dns_service(ip: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "kube-dns",
            # Served by localcluster.dns on its address, not by endpoints: kube-proxy skips it.
            "labels": {"k8s-app": "kube-dns", proxy.SERVICE_PROXY_NAME_LABEL: proxy.SERVED_BY},
        },
        "spec": {
            "clusterIP": ip,
            "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}],
        },
    }


# ---- teardown ----------------------------------------------------------------------------
def teardown(cluster: ClusterHandle, out: TextIO) -> None:
    """While the cluster still runs: let the kubelet remove every pod, so containerd tears
    down their sandboxes, network namespaces and mounts the regular way."""
    try:
        pods = cluster.api("GET", "/api/v1/pods", timeout=5)["items"]
    except (OSError, urllib.error.URLError, ValueError):
        return  # the apiserver is gone already; restore_host cleans up by force
    for p in pods:
        ns, name = p["metadata"]["namespace"], p["metadata"]["name"]
        with contextlib.suppress(OSError, urllib.error.URLError):
            cluster.api(
                "DELETE",
                f"/api/v1/namespaces/{ns}/pods/{name}",
                {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0},
                timeout=5,
            )
    sock = containerd_sock(cluster)
    if not sock.exists():
        return
    ctr = ["ctr", "--address", str(sock), "--namespace", "k8s.io"]
    # Deleting a pod makes the kubelet stop its sandbox (CNI DEL, netns removed); the stopped
    # containers themselves are left for its GC, which `down` makes unnecessary.
    deadline = time.monotonic() + 30
    running: list[str] = []
    while time.monotonic() < deadline:
        tasks = _run([*ctr, "tasks", "ls"], check=False).stdout.splitlines()[1:]
        running = [t for t in tasks if "STOPPED" not in t]
        if not running:
            return
        time.sleep(0.5)
    out.write(f"  {len(running)} containers still running after 30s; killing them\n")


def _kill_cgroup_tree(root: str) -> None:
    """SIGKILLs every process left in the cluster's cgroup tree and removes the cgroups."""
    base = Path("/sys/fs/cgroup")
    hierarchies = [h for h in base.iterdir() if (h / root.lstrip("/")).is_dir()]
    for h in hierarchies:
        for procs in (h / root.lstrip("/")).rglob("cgroup.procs"):
            for pid in procs.read_text().split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
    for h in hierarchies:
        dirs = sorted(
            (p for p in (h / root.lstrip("/")).rglob("*") if p.is_dir()),
            key=lambda p: len(p.parts),
            reverse=True,
        )
        for d in [*dirs, h / root.lstrip("/")]:
            for _ in range(20):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)


def _kill_shims(sock: Path) -> None:
    """containerd-shim processes re-parent to init; ours name our socket on their command line."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline and b"containerd-shim" in cmdline[0] and str(sock).encode() in cmdline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)


def _unmount_under(prefixes: list[str]) -> None:
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mp = line.split()[4].replace("\\040", " ")
        if any(mp == p or mp.startswith(p.rstrip("/") + "/") for p in prefixes):
            mounts.append(mp)
    for mp in sorted(set(mounts), key=len, reverse=True):
        _run(["umount", "-l", mp], check=False)


def restore_host(cluster: ClusterHandle, out: TextIO) -> None:
    """After the processes are stopped: remove leftovers and put back what `up` changed."""
    host = cluster.load().get("host", {})
    _kill_shims(containerd_sock(cluster))
    if host.get("cgroup_root"):
        _kill_cgroup_tree(host["cgroup_root"])
    _unmount_under([str(cluster.dir)])
    proxy.remove(cluster)
    if host.get("bridge"):
        _run(["ip", "link", "delete", host["bridge"]], check=False)
    if host.get("netns_dir_existed") is False:
        with contextlib.suppress(OSError):
            Path("/var/run/netns").rmdir()  # only when empty: never another run's namespaces
    if host.get("ip_forward") is not None and _ip_forward() != host["ip_forward"]:
        Path("/proc/sys/net/ipv4/ip_forward").write_text(host["ip_forward"] + "\n")
    for sub in ("containerd", "kubelet", "cni", "pod-logs"):
        shutil.rmtree(cluster.dir / sub, ignore_errors=True)
    out.write(f"cluster {cluster.name!r}: node removed (bridge {host.get('bridge')})\n")
