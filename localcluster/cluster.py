"""Bringing a named local cluster up and down: the control plane's command lines, the `sim`
profile's KWOK nodes, and the `node` profile's real node (`localcluster.node`).

Where a cluster lives, its ports and what it started are `localcluster.handle`'s: `Cluster` is
a `ClusterHandle` that can also start and stop.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TextIO

from localcluster import build as buildmod
from localcluster import inotify, pki
from localcluster import node as nodemod
from localcluster.handle import ClusterError, ClusterHandle
from localcluster.jobset import KEEP_RUNNING_LABEL
from localcluster.procs import Proc, launch, stop
from localcluster.versions import binary, kwok_stages_path, state_root

Profile = Literal["sim", "node"]
SIM_AGENTS = "sim-agents"
"""The `--agents` component's name in the record (`localcluster.simagents.COMPONENT`)."""
SIM_AGENTS_SOCKET = "sim-agents.sock"
"""Its control socket in the cluster's directory (`localcluster.simagents.SOCKET_NAME`)."""


@dataclass
class Options:
    """What `up` was asked for."""

    profile: Profile = "sim"
    nodes: int = 3
    gpus_per_node: int = 0
    pods_per_node: int = 250
    feature_gates: dict[str, bool] = field(default_factory=dict)
    scheduler_qps: int | None = None
    node_monitor_grace_seconds: int | None = None
    endpoint_batch_seconds: float | None = None
    """The controller-manager's Endpoints and EndpointSlice update batching period (default
    none): every pod change behind a Service costs those controllers a pass over all of its
    pods, so a large gang restarting at once keeps them busy unless changes are batched."""
    gang_scheduling: bool = False
    """KEP-4671 gang scheduling: the `GANG_SCHEDULING_GATES` on the control plane, the
    `scheduling.k8s.io/v1alpha2` API served, and the scheduler's `GangScheduling` plugin."""
    agents: bool = False
    """`sim` only: the `sim-agents` component (`localcluster.simagents`), the simulated kubelet
    running the real agent for every GangJob pod on the KWOK nodes."""

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "pods_per_node": self.pods_per_node,
            "feature_gates": self.feature_gates,
            "scheduler_qps": self.scheduler_qps,
            "node_monitor_grace_seconds": self.node_monitor_grace_seconds,
            "endpoint_batch_seconds": self.endpoint_batch_seconds,
            "gang_scheduling": self.gang_scheduling,
            "agents": self.agents,
        }

    def control_plane_gates(self) -> dict[str, bool]:
        """The feature gates of the apiserver, controller-manager and scheduler: those gang
        scheduling needs, then `feature_gates` (which wins)."""
        return {**(GANG_SCHEDULING_GATES if self.gang_scheduling else {}), **self.feature_gates}


GANG_SCHEDULING_GATES: dict[str, bool] = {
    "GenericWorkload": True,
    "GangScheduling": True,
    "TopologyAwareWorkloadScheduling": True,
    "WorkloadAwarePreemption": True,
}
"""All alpha and off by default in 1.36: `GenericWorkload` serves the Workload and PodGroup API
(and `spec.schedulingGroup` on pods), `GangScheduling` (which requires it) the scheduler plugin;
`TopologyAwareWorkloadScheduling` a PodGroup's `schedulingConstraints.topology` and the
scheduler plugins that place a gang in one domain of a node label (`TopologyPlacementGenerator`,
`PodGroupPodsCount`); `WorkloadAwarePreemption` a PodGroup's `disruptionMode` and
`priorityClassName`, and the scheduler's preemption of whole PodGroups."""
GANG_SCHEDULING_API = "scheduling.k8s.io/v1alpha2"


class Cluster(ClusterHandle):
    """One named local cluster that `up` starts and `down` stops."""

    # ---- up / down ---------------------------------------------------------------------------
    def up(self, opts: Options, out: TextIO = sys.stderr) -> Path:
        """Starts the cluster (or finds it up) and returns the admin kubeconfig."""
        if self.is_up():
            prev = self.load().get("options", {}).get("profile")
            if prev != opts.profile:
                raise ClusterError(
                    f"cluster {self.name!r} is up with profile {prev!r}, not {opts.profile!r}; "
                    f"run `localcluster down --name {self.name}` first"
                )
            had = self.load().get("options", {})
            differ = [f"{k}={v}" for k, v in had.items() if opts.to_json().get(k) != v]
            if differ:
                out.write(
                    f"cluster {self.name!r} is up already, with {', '.join(differ)}: using it "
                    f"as it is (`localcluster down --name {self.name}` to start it anew)\n"
                )
            return self.kubeconfig
        # Names outside WELL_KNOWN_SLOTS hash to a slot: two of them may share one, and with it
        # the ports and the pod bridge.
        same_slot = [
            c.name
            for c in known_clusters()
            if c.name != self.name and c.ports.slot == self.ports.slot and c.is_up()
        ]
        if same_slot:
            raise ClusterError(
                f"cluster {self.name!r} would use the ports of {same_slot[0]!r} (slot "
                f"{self.ports.slot}), which is up; pick another name"
            )
        if self.procs():
            out.write(f"cluster {self.name!r} is partly up; stopping what is left of it\n")
            self.down(out)
        if opts.agents and opts.profile != "sim":
            raise ClusterError("--agents runs the simulated kubelet: the sim profile only")
        t0 = time.monotonic()
        buildmod.build(out)
        inotify.check(opts.profile)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.save({"name": self.name, "options": opts.to_json(), "processes": [], "ready": False})
        try:
            self._start(opts, out)
        except BaseException:
            out.write(f"cluster {self.name!r} failed to come up; stopping what started\n")
            self.down(out)
            raise
        state = self.load()
        state["ready"] = True
        state["up_seconds"] = round(time.monotonic() - t0, 1)
        self.save(state)
        out.write(f"cluster {self.name!r} ({opts.profile}) up in {state['up_seconds']}s\n")
        return self.kubeconfig

    def down(self, out: TextIO = sys.stderr) -> list[str]:
        """Stops what `up` recorded, newest first, and undoes its changes to the host."""
        state = self.load()
        if not state:
            return []
        stopped: list[str] = []
        if state.get("options", {}).get("profile") == "node":
            nodemod.teardown(self, out)
        for proc in reversed(self.procs()):
            if stop(proc):
                stopped.append(proc.name)
        if state.get("options", {}).get("profile") == "node":
            nodemod.restore_host(self, out)
        # A fresh etcd each time: a later `up` must not inherit objects from this run.
        shutil.rmtree(self.dir / "etcd", ignore_errors=True)
        (self.dir / SIM_AGENTS_SOCKET).unlink(missing_ok=True)  # left by a killed sim-agents
        self.state_file.unlink(missing_ok=True)
        if stopped:
            out.write(f"cluster {self.name!r}: stopped {', '.join(stopped)}\n")
        return stopped

    def describe(self) -> dict[str, Any]:
        state = self.load()
        return {
            "name": self.name,
            "profile": state.get("options", {}).get("profile"),
            "up": self.is_up(),
            "kubeconfig": str(self.kubeconfig),
            "apiserver": self.server,
            # Where pods reach this host (the controller's arrival endpoint, say): the node
            # profile's bridge gateway.
            "host_address": (
                nodemod.Bridge.for_slot(self.ports.slot).gateway
                if state.get("options", {}).get("profile") == "node"
                else None
            ),
            "processes": [
                {"name": p.name, "pid": p.pid, "running": p.alive()} for p in self.procs()
            ],
        }

    def _start(self, opts: Options, out: TextIO) -> None:
        node_name = nodemod.NODE_NAME if opts.profile == "node" else None
        bridge = nodemod.Bridge.for_slot(self.ports.slot) if opts.profile == "node" else None
        node_ip = bridge.gateway if bridge else None
        pki.ensure_pki(
            self.pki, [self.service_ip, *([node_ip] if node_ip else [])], node_name, node_ip
        )
        for ident in pki.client_identities(node_name):
            pki.write_kubeconfig(
                self.dir / f"{ident.stem}.kubeconfig", self.pki, self.server, ident.stem, ident.cn
            )
        gates = ",".join(
            f"{k}={'true' if v else 'false'}" for k, v in opts.control_plane_gates().items()
        )
        gate_flags = [f"--feature-gates={gates}"] if gates else []

        out.write(f"starting etcd on 127.0.0.1:{self.ports.etcd}\n")
        self.launch("etcd", self._etcd_cmd())
        self.wait_for(
            "etcd", lambda: _http_ok(f"http://127.0.0.1:{self.ports.etcd}/health"), 30, "etcd"
        )
        out.write(f"starting kube-apiserver on 127.0.0.1:{self.ports.apiserver}\n")
        self.launch("kube-apiserver", self._apiserver_cmd(gate_flags, opts))
        self.wait_for("kube-apiserver /readyz", self._readyz, 90, "kube-apiserver")
        out.write("starting kube-controller-manager and kube-scheduler\n")
        self.launch("kube-controller-manager", self._kcm_cmd(gate_flags, opts))
        self.launch("kube-scheduler", self._scheduler_cmd(gate_flags, opts))
        if opts.profile == "sim":
            self.launch("kwok", self._kwok_cmd())
            self._create_kwok_nodes(opts)
            self.wait_for(
                f"{opts.nodes} Ready nodes",
                lambda: self.ready_nodes() >= opts.nodes,
                60 + opts.nodes // 10,
                "kwok",
                out,
            )
        else:
            assert bridge is not None
            nodemod.start_node(self, bridge, opts.feature_gates, out)
        # The default ServiceAccount is what pods run as; wait for its controller so that the
        # first pod a test creates is not refused.
        self.wait_for(
            "default ServiceAccount",
            lambda: self.exists("/api/v1/namespaces/default/serviceaccounts/default"),
            60,
            "kube-controller-manager",
        )
        if opts.agents:
            self._start_agents(out)

    def _start_agents(self, out: TextIO) -> None:
        """The simulated kubelet with the real agents (`localcluster.simagents`), serving once
        its control socket is there."""
        out.write("starting sim-agents (the simulated kubelet and the real agents)\n")
        sock = self.dir / SIM_AGENTS_SOCKET
        sock.unlink(missing_ok=True)
        self.launch(
            SIM_AGENTS,
            [sys.executable, "-m", "localcluster.simagents", "--cluster", self.name],
        )
        self.wait_for("sim-agents' socket", sock.exists, 60, SIM_AGENTS, out)

    def _readyz(self) -> bool:
        return bool(self.api("GET", "/readyz", timeout=3) == "ok")

    # ---- one component at a time ------------------------------------------------------------
    def command_of(self, component: str) -> list[str]:
        """The command line the cluster's running ``component`` (e.g. ``kube-apiserver``) has."""
        proc = self._recorded(component)
        raw = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        return [a.decode() for a in raw.split(b"\0") if a]

    def restart_component(
        self, component: str, cmd: list[str] | None = None, down_seconds: float = 0.0
    ) -> list[str]:
        """Stops the cluster's ``component`` (its recorded PID), keeps it down ``down_seconds``,
        and starts ``cmd`` (None: the command line it had) in its place, recorded where the old
        one was so that `down` stops it in the same order; returns once it serves again
        (etcd's /health, the apiserver's /readyz; others once running). Returns the command
        line it had before, to restart it as it was. A component that has exited is started
        again with ``cmd``, as the kubelet restarts a static pod."""
        old = self._recorded(component)
        before = self.command_of(component) if old.alive() else None
        if before is None and cmd is None:
            raise ClusterError(f"{component} has exited: give the command line to start")
        stop(old)
        time.sleep(down_seconds)  # the outage itself: nothing to wait for
        new = launch(component, cmd or before or [], Path(old.log))
        state = self.load()
        state["processes"] = [
            new.to_json() if p.get("pid") == old.pid else p for p in state.get("processes", [])
        ]
        self.save(state)

        def ok() -> bool:
            if component == "etcd":
                return _http_ok(f"http://127.0.0.1:{self.ports.etcd}/health")
            if component == "kube-apiserver":
                return self._readyz()
            return True

        # Only this component's health: another may exit meanwhile (the scheduler does when
        # its cache goes wrong across an apiserver restart); that is its supervisor's business.
        deadline = time.monotonic() + 90
        while True:
            if not new.alive():
                raise ClusterError(f"{component} exited on restart; see {old.log}")
            with contextlib.suppress(OSError, ValueError, urllib.error.URLError):
                if ok():
                    return before or cmd or []
            if time.monotonic() > deadline:
                raise ClusterError(f"{component} not serving 90 s after its restart; see {old.log}")
            time.sleep(0.25)

    def _recorded(self, component: str) -> Proc:
        for proc in self.procs():
            if proc.name == component:
                return proc
        raise ClusterError(f"cluster {self.name!r} runs no {component!r}")

    # ---- component command lines ----------------------------------------------------------
    def _etcd_cmd(self) -> list[str]:
        p = self.ports
        return [
            str(binary("etcd").path),
            f"--name={self.name}",
            f"--data-dir={self.dir / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{p.etcd}",
            f"--advertise-client-urls=http://127.0.0.1:{p.etcd}",
            f"--listen-peer-urls=http://127.0.0.1:{p.etcd_peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{p.etcd_peer}",
            f"--initial-cluster={self.name}=http://127.0.0.1:{p.etcd_peer}",
            "--listen-metrics-urls=",
            "--quota-backend-bytes=8589934592",
            # Tests and benchmarks write fast and throw the data away: fewer fsyncs.
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ]

    def _apiserver_cmd(self, gate_flags: list[str], opts: Options) -> list[str]:
        k = self.pki
        runtime_config = (
            [f"--runtime-config={GANG_SCHEDULING_API}=true"] if opts.gang_scheduling else []
        )
        return [
            str(binary("kube-apiserver").path),
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.ports.apiserver}",
            f"--etcd-servers=http://127.0.0.1:{self.ports.etcd}",
            "--authorization-mode=Node,RBAC",
            f"--client-ca-file={k / 'ca.crt'}",
            f"--tls-cert-file={k / 'apiserver.crt'}",
            f"--tls-private-key-file={k / 'apiserver.key'}",
            f"--kubelet-client-certificate={k / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={k / 'apiserver-kubelet-client.key'}",
            f"--kubelet-certificate-authority={k / 'ca.crt'}",
            "--kubelet-preferred-address-types=InternalIP",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={k / 'sa.pub'}",
            f"--service-account-signing-key-file={k / 'sa.key'}",
            f"--service-cluster-ip-range={self.service_cidr}",
            # The Endpoints API refuses a loopback address; nothing here needs the endpoints.
            "--endpoint-reconciler-type=none",
            f"--requestheader-client-ca-file={k / 'front-proxy-ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-username-headers=X-Remote-User",
            f"--proxy-client-cert-file={k / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={k / 'front-proxy-client.key'}",
            "--allow-privileged=true",
            "--profiling=false",
            "--event-ttl=1h",
            "--v=1",
            *gate_flags,
            *runtime_config,
        ]

    def _component_auth(self, stem: str) -> list[str]:
        kc = self.dir / f"{stem}.kubeconfig"
        return [
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1",
            "--leader-elect=false",
            "--profiling=false",
        ]

    def _kcm_cmd(self, gate_flags: list[str], opts: Options) -> list[str]:
        k = self.pki
        cmd = [
            str(binary("kube-controller-manager").path),
            *self._component_auth("controller-manager"),
            f"--secure-port={self.ports.controller_manager}",
            f"--root-ca-file={k / 'ca.crt'}",
            f"--service-account-private-key-file={k / 'sa.key'}",
            "--use-service-account-credentials=true",
            f"--cluster-signing-cert-file={k / 'ca.crt'}",
            f"--cluster-signing-key-file={k / 'ca.key'}",
            "--allocate-node-cidrs=false",
            "--v=1",
            *gate_flags,
        ]
        if opts.node_monitor_grace_seconds is not None:
            cmd.append(f"--node-monitor-grace-period={opts.node_monitor_grace_seconds}s")
        if opts.endpoint_batch_seconds:
            period = f"{opts.endpoint_batch_seconds:g}s"
            cmd += [
                f"--endpoint-updates-batch-period={period}",
                f"--endpointslice-updates-batch-period={period}",
            ]
        return cmd

    def _scheduler_cmd(self, gate_flags: list[str], opts: Options) -> list[str]:
        cmd = [
            str(binary("kube-scheduler").path),
            *self._component_auth("scheduler"),
            f"--secure-port={self.ports.scheduler}",
            "--v=1",
            *gate_flags,
        ]
        if opts.gang_scheduling:
            # A --config file makes the scheduler ignore --kubeconfig and --kube-api-qps/-burst:
            # the file carries them.
            config = self.dir / "scheduler-config.json"
            config.write_text(json.dumps(scheduler_config(self.dir / "scheduler.kubeconfig", opts)))
            cmd.append(f"--config={config}")
        elif opts.scheduler_qps:
            cmd += [
                f"--kube-api-qps={opts.scheduler_qps}",
                f"--kube-api-burst={2 * opts.scheduler_qps}",
            ]
        return cmd

    def _kwok_cmd(self) -> list[str]:
        stages = self.dir / "kwok-stages.yaml"
        stages.write_text(kwok_stages(kwok_stages_path().read_text()))
        return [
            str(binary("kwok").path),
            f"--kubeconfig={self.dir / 'kwok.kubeconfig'}",
            f"--config={stages}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
            "--manage-nodes-with-label-selector=",
            f"--disregard-status-with-annotation-selector={KWOK_STATUS_ANNOTATION}=custom",
            "--disregard-status-with-label-selector=",
            "--node-lease-duration-seconds=40",
            "--cidr=10.240.0.0/16",
            "--node-ip=10.239.0.1",
            f"--server-address=127.0.0.1:{self.ports.kwok}",
            "--enable-crds=",
        ]

    def _create_kwok_nodes(self, opts: Options) -> None:
        existing = {n["metadata"]["name"] for n in self.api("GET", "/api/v1/nodes")["items"]}
        for i in range(opts.nodes):
            name = f"kwok-node-{i}"
            if name not in existing:
                self.api("POST", "/api/v1/nodes", kwok_node(name, opts))


KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
"""`fake` on the nodes KWOK plays the kubelet of (`kwok_node`); anything else takes a new node
out of its hands."""
KWOK_STATUS_ANNOTATION = "kwok.x-k8s.io/status"
"""`custom` on a node whose status KWOK leaves alone, even one it took on before (a lost node)."""
SIMULATED_KUBELET_LABEL = "localcluster.gangjob.io/simulated-kubelet"
"""A pod with this label has its deletion finished by `localcluster.simkubelet`, not by KWOK.
KWOK deletes a terminating pod by name alone: under load its delete comes late and removes a
new pod of the same name (a recreated worker). The real kubelet deletes for the pod's UID, and
so does the simulation."""


def scheduler_config(kubeconfig: Path, opts: Options) -> dict[str, Any]:
    """The KubeSchedulerConfiguration of a gang-scheduling cluster: the default profile with
    the `GangScheduling` plugin enabled at every extension point it implements (PreEnqueue,
    Permit), and the topology-aware placement plugins. 1.36 adds them to the defaults when
    their gates are on; naming them is what a cluster whose scheduler runs from a
    configuration file needs, so they are spelt out here."""
    connection: dict[str, Any] = {"kubeconfig": str(kubeconfig)}
    if opts.scheduler_qps:
        connection.update(qps=opts.scheduler_qps, burst=2 * opts.scheduler_qps)
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": connection,
        "leaderElection": {"leaderElect": False},
        "enableProfiling": False,
        "profiles": [
            {
                "schedulerName": "default-scheduler",
                "plugins": {
                    "multiPoint": {
                        "enabled": [
                            {"name": "GangScheduling"},
                            {"name": "TopologyPlacementGenerator"},
                            {"name": "PodGroupPodsCount", "weight": 1},
                        ]
                    }
                },
            }
        ],
    }


def kwok_stages(stages: str) -> str:
    """KWOK's stage definitions, its pod-delete stage skipping pods labelled
    `SIMULATED_KUBELET_LABEL` and its pod-complete stage skipping pods labelled
    `KEEP_RUNNING_LABEL` (the JobSet peer's pods, owned by Jobs, which KWOK completes at once)."""
    docs = stages.strip().split("\n---\n")
    _skip_labelled(docs, "pod-delete", SIMULATED_KUBELET_LABEL)
    _skip_labelled(docs, "pod-complete", KEEP_RUNNING_LABEL)
    _started(docs)
    return "\n---\n".join(docs) + "\n"


_READY_CONTAINER = "      {{ range .spec.containers }}\n"
_RESTART_COUNT = "        restartCount: 0\n"


def _started(docs: list[str]) -> None:
    """Makes the pod-ready stage mark each running container `started: true`, as a real kubelet
    does for one without a startup probe (KWOK leaves it out: a container then reads as still
    starting, and every pass of the controller looks at it as it would at a stuck one)."""
    i = _stage(docs, "pod-ready")
    head, sep, tail = docs[i].partition(_READY_CONTAINER)
    if not sep or _RESTART_COUNT not in tail:
        raise ValueError("KWOK's pod-ready stage has no container status to mark started")
    started = tail.replace(_RESTART_COUNT, _RESTART_COUNT + "        started: true\n", 1)
    docs[i] = head + sep + started


def _skip_labelled(docs: list[str], stage: str, label: str) -> None:
    """Makes the stage named `stage` leave pods carrying `label` alone."""
    i = _stage(docs, stage)
    head, sep, tail = docs[i].partition("    matchExpressions:\n")
    if not sep:
        raise ValueError(f"KWOK's {stage} stage has no matchExpressions to extend")
    skip = f"    - key: '.metadata.labels.[\"{label}\"]'\n      operator: 'DoesNotExist'\n"
    docs[i] = head + sep + skip + tail


def _stage(docs: list[str], stage: str) -> int:
    """Where in `docs` KWOK's stage named `stage` is."""
    for i, doc in enumerate(docs):
        if f"name: {stage}\n" in doc:
            return i
    raise ValueError(f"KWOK's stages have no {stage} stage")


def kwok_node(name: str, opts: Options) -> dict[str, Any]:
    """A simulated node that declares the features GangJob's pods require."""
    resources: dict[str, str] = {
        "cpu": "64",
        "memory": "512Gi",
        "pods": str(opts.pods_per_node),
        "ephemeral-storage": "1Ti",
    }
    if opts.gpus_per_node:
        resources["nvidia.com/gpu"] = str(opts.gpus_per_node)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
            },
        },
        "status": {
            "allocatable": resources,
            "capacity": dict(resources),
            # Pods with a RestartAllContainers rule schedule only onto nodes declaring it.
            "declaredFeatures": ["RestartAllContainersOnContainerExits"],
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "v1.36.2",
                "kernelVersion": "kwok",
                "osImage": "kwok",
                "containerRuntimeVersion": "kwok",
            },
        },
    }


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as resp:
        return bool(resp.status == 200)


def known_clusters() -> list[Cluster]:
    root = state_root() / "clusters"
    if not root.is_dir():
        return []
    return [Cluster(d.name) for d in sorted(root.iterdir()) if (d / "cluster.json").exists()]
