"""Running GangJob's own controller and kubectl against a local cluster, for tests, benchmarks
and demos: the controller as a subprocess (so it can be killed at any point) with the
least-privilege RBAC of manifests/rbac (so a missing verb shows), and the pinned kubectl.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from api.constants import CRD_NAME
from localcluster.addons import admin_request, crd_established
from localcluster.handle import ClusterHandle
from localcluster.procs import free_port
from localcluster.versions import binary

REPO = Path(__file__).resolve().parents[1]
SYSTEM_NS = "gangjob-system"
SA = "gangjob-controller"


def kubectl(
    cluster: ClusterHandle, *args: str, stdin: str | None = None, timeout: float = 120
) -> str:
    """Runs the pinned kubectl as the cluster's admin; raises with its stderr on failure."""
    res = subprocess.run(
        [str(binary("kubectl").path), f"--kubeconfig={cluster.kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if res.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)} failed: {res.stderr}")
    return res.stdout


def install_crd(cluster: ClusterHandle, timeout: float = 60.0) -> None:
    """`make install` for a local cluster: the committed CRD, applied and Established."""
    kubectl(
        cluster,
        "apply",
        "--server-side",
        "--force-conflicts",
        "-k",
        str(REPO / "manifests" / "crd"),
    )
    wait_crd_established(cluster, timeout)


def wait_crd_established(cluster: ClusterHandle, timeout: float = 60.0) -> None:
    """Returns once the GangJob CRD is Established; raises after `timeout`."""
    # Polled, not `kubectl wait`: on a fresh apiserver the CRD (its schema embeds a whole pod
    # template) is stored with `conditions: null` for a moment, which `kubectl wait` takes for
    # an error rather than for "not yet".
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}"
    deadline = time.monotonic() + timeout
    while not crd_established(admin_request(cluster, "GET", path)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"CRD {CRD_NAME} not Established after {timeout:.0f}s")
        time.sleep(0.2)


def controller_kubeconfig(cluster: ClusterHandle) -> Path:
    """A kubeconfig with a token of the controller's ServiceAccount, bound by manifests/rbac."""
    ns_yaml = kubectl(cluster, "create", "namespace", SYSTEM_NS, "--dry-run=client", "-o", "yaml")
    kubectl(cluster, "apply", "-f", "-", stdin=ns_yaml)
    kubectl(cluster, "apply", "-k", str(REPO / "manifests" / "rbac"))
    token = kubectl(cluster, "-n", SYSTEM_NS, "create", "token", SA, "--duration=2h").strip()
    return token_kubeconfig(cluster, token, cluster.dir / "gangjob-controller.kubeconfig", SA)


def token_kubeconfig(cluster: ClusterHandle, token: str, path: Path, user: str) -> Path:
    """Writes a kubeconfig that reaches `cluster` with a bearer token (a ServiceAccount's)."""
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
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": user}}],
        "current-context": "c",
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


class ControllerProcess:
    """`gangjob-controller` as a child process; `kill()` is a SIGKILL, as a crash would be."""

    def __init__(
        self,
        kubeconfig: Path,
        args: Sequence[str],
        log: Path,
        *,
        arrivals: bool = False,
        arrival_host: str = "127.0.0.1",
        arrival_tls: bool = False,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.args = list(args)
        self.log = log
        self.metrics_port = free_port()
        self.health_port = free_port()
        # The agents' arrival endpoint (controller.arrivals): on loopback for agents run on this
        # host, on the pod bridge's gateway for agents in the node profile's pods.
        self.arrival_port = free_port() if arrivals else None
        self.arrival_host = arrival_host
        # https: the controller serves its own certificate (for the host's address), kept in
        # the Secret gangjob-arrival-tls of --leader-election-namespace.
        self.arrival_scheme = "https" if arrival_tls else "http"
        self.env = dict(env or {})
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def arrival_url(self) -> str | None:
        if not self.arrival_port:
            return None
        return f"{self.arrival_scheme}://{self.arrival_host}:{self.arrival_port}"

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
        if self.arrival_port:
            cmd += [
                f"--arrival-bind-address={self.arrival_host}:{self.arrival_port}",
                f"--arrival-url={self.arrival_url}",
            ]
        with open(self.log, "ab") as fh:
            self.proc = subprocess.Popen(
                cmd,
                stdout=fh,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                env={**os.environ, **self.env},
            )

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

    def wait_ready(self, timeout: float = 60) -> None:
        """Until /readyz answers 200 (caches synced); raises with the log if it never does."""
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{self.health_port}/readyz"
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"controller exited:\n{self.logs()}")
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass  # not listening yet, or 503 until the caches have synced
            time.sleep(0.1)  # a local port, not cluster state: nothing to watch
        raise RuntimeError(f"controller not ready after {timeout}s:\n{self.logs()}")

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
