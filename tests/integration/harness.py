"""Running the real controller in tests: as a subprocess (so it can be killed at any point),
with the least-privilege RBAC of manifests/rbac (so a missing verb fails a test), against the
`sim` cluster.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from api.constants import LABEL_NAME
from controller.kube import CRDS, GANGJOBS, PODS, JsonDict, Kube, NotFound
from localcluster.cluster import Cluster
from localcluster.versions import binary

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "manifests" / "crd" / "gangjob.io_gangjobs.yaml"
SYSTEM_NS = "gangjob-system"
SA = "gangjob-controller"


def kubectl(cluster: Cluster, *args: str, stdin: str | None = None) -> str:
    res = subprocess.run(
        [str(binary("kubectl").path), f"--kubeconfig={cluster.kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if res.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed: {res.stderr}")
    return res.stdout


async def install_crd(kube: Kube) -> None:
    """Applies the committed CRD (create or replace) and waits until it is Established."""
    crd = yaml.safe_load(CRD_FILE.read_text())
    name = crd["metadata"]["name"]
    try:
        current = await kube.get(CRDS, name)
        crd["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        await kube.replace(CRDS, name, crd)
    except NotFound:
        await kube.create(CRDS, crd)
    for _ in range(200):
        got = await kube.get(CRDS, name)
        conds = {c["type"]: c["status"] for c in got.get("status", {}).get("conditions", [])}
        if conds.get("Established") == "True":
            return
        await asyncio.sleep(0.05)  # the CRD's status has no watchable transition worth one
    raise AssertionError("CRD not Established")


def controller_kubeconfig(cluster: Cluster) -> Path:
    """A kubeconfig with a token of the controller's ServiceAccount, bound by manifests/rbac."""
    ns_yaml = kubectl(cluster, "create", "namespace", SYSTEM_NS, "--dry-run=client", "-o", "yaml")
    kubectl(cluster, "apply", "-f", "-", stdin=ns_yaml)
    kubectl(cluster, "apply", "-k", str(REPO / "manifests" / "rbac"))
    token = kubectl(cluster, "-n", SYSTEM_NS, "create", "token", SA, "--duration=2h").strip()
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "c",
                "cluster": {
                    "server": cluster.server,
                    "certificate-authority": str(cluster.pki / "ca.crt"),
                },
            }
        ],
        "users": [{"name": SA, "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": SA}}],
        "current-context": "c",
    }
    path = cluster.dir / "gangjob-controller.kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ControllerProcess:
    """`gangjob-controller` as a child process; `kill()` is a SIGKILL, as a crash would be."""

    def __init__(self, kubeconfig: Path, args: Sequence[str], log: Path) -> None:
        self.kubeconfig = kubeconfig
        self.args = list(args)
        self.log = log
        self.metrics_port = free_port()
        self.health_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        cmd = [
            sys.executable,
            "-m",
            "controller.main",
            f"--kubeconfig={self.kubeconfig}",
            f"--metrics-bind-address=127.0.0.1:{self.metrics_port}",
            f"--health-probe-bind-address=127.0.0.1:{self.health_port}",
            "--log-level=debug",
            *self.args,
        ]
        with open(self.log, "ab") as fh:
            self.proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> int | None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        """A sample from /metrics (0 when absent)."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            text = resp.read().decode()
        want = labels or {}
        total = 0.0
        for line in text.splitlines():
            if not line.startswith(name) or line.startswith("#"):
                continue
            head, _, value = line.rpartition(" ")
            metric, _, rest = head.partition("{")
            if metric != name:
                continue
            got = dict(kv.split("=", 1) for kv in rest.rstrip("}").split(",") if "=" in kv)
            if all(got.get(k) == f'"{v}"' for k, v in want.items()):
                total += float(value)
        return total

    def logs(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-6000:]
        except OSError:
            return ""


def gangjob(name: str, replicas: int, **spec: Any) -> JsonDict:
    """A GangJob manifest with a busybox trainer (KWOK runs it; nothing executes on sim)."""
    body: JsonDict = {
        "apiVersion": "gangjob.io/v1alpha1",
        "kind": "GangJob",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "template": {
                "spec": {
                    "containers": [
                        {"name": "trainer", "image": "localhost/busybox:dev", "command": ["true"]}
                    ]
                }
            },
            **spec,
        },
    }
    return body


async def gang_pods(kube: Kube, ns: str, job: str) -> list[JsonDict]:
    return (await kube.list(PODS, ns, label_selector=f"{LABEL_NAME}={job}")).items


async def watch_job(
    kube: Kube,
    ns: str,
    name: str,
    predicate: Callable[[JsonDict], bool],
    timeout: float = 60,
    what: str = "",
) -> JsonDict:
    from tests.waiting import wait_for

    return await wait_for(kube, GANGJOBS, name, ns, predicate, timeout=timeout, what=what)


async def controller_running(
    kubeconfig: Path, args: Sequence[str], log: Path
) -> AsyncIterator[ControllerProcess]:
    ctl = ControllerProcess(kubeconfig, args, log)
    ctl.start()
    try:
        yield ctl
    finally:
        ctl.stop()


def phase_is(phase: str) -> Callable[[JsonDict], bool]:
    return lambda job: job.get("status", {}).get("phase") == phase
