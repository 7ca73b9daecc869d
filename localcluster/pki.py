"""Certificates and kubeconfigs of a local cluster, made with openssl.

One CA signs every serving and client certificate; a second CA signs the front-proxy client (the
aggregation layer insists on a separate one); an RSA pair signs service-account tokens. Each
component gets its own client identity, so RBAC and the Node authorizer apply as in a real
cluster; the admin identity is in ``system:masters``.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

DAYS = "3650"


class PkiError(RuntimeError):
    """openssl failed; the message carries its output."""


@dataclass(frozen=True)
class Identity:
    """A client certificate: file stem, common name (user) and organisation (group)."""

    stem: str
    cn: str
    org: str | None = None


def _openssl(*args: str) -> None:
    if shutil.which("openssl") is None:
        raise PkiError("openssl is not on PATH (Debian package `openssl`)")
    res = subprocess.run(["openssl", *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise PkiError(f"openssl {args[0]} failed: {res.stderr.strip()}")


def _ca(d: Path, stem: str, cn: str) -> None:
    if (d / f"{stem}.crt").exists():
        return
    _openssl("genrsa", "-out", str(d / f"{stem}.key"), "2048")
    _openssl(
        "req", "-x509", "-new", "-key", str(d / f"{stem}.key"), "-subj", f"/CN={cn}",
        "-days", DAYS, "-out", str(d / f"{stem}.crt"),
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
    )  # fmt: skip


def _leaf(
    d: Path,
    ca: str,
    stem: str,
    cn: str,
    org: str | None = None,
    sans: list[str] | None = None,
    server: bool = False,
) -> None:
    if (d / f"{stem}.crt").exists():
        return
    subj = f"/CN={cn}" + (f"/O={org}" if org else "")
    key, csr, crt = (d / f"{stem}.{ext}" for ext in ("key", "csr", "crt"))
    _openssl("genrsa", "-out", str(key), "2048")
    _openssl("req", "-new", "-key", str(key), "-subj", subj, "-out", str(csr))
    ext = d / f"{stem}.ext"
    lines = [
        "basicConstraints=critical,CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        "extendedKeyUsage=" + ("serverAuth,clientAuth" if server else "clientAuth"),
    ]
    if sans:
        lines.append("subjectAltName=" + ",".join(sans))
    ext.write_text("\n".join(lines) + "\n")
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(d / f"{ca}.crt"),
        "-CAkey", str(d / f"{ca}.key"), "-CAcreateserial", "-days", DAYS,
        "-extfile", str(ext), "-out", str(crt),
    )  # fmt: skip
    csr.unlink()
    ext.unlink()


def ensure_pki(
    d: Path, apiserver_ips: list[str], node_name: str | None, node_ip: str | None
) -> None:
    """Creates whatever of the cluster's PKI is missing in ``d`` (idempotent)."""
    d.mkdir(parents=True, exist_ok=True)
    _ca(d, "ca", "gangjob-local-ca")
    _ca(d, "front-proxy-ca", "gangjob-local-front-proxy-ca")
    sans = ["DNS:localhost", "DNS:kubernetes", "DNS:kubernetes.default"]
    sans += ["DNS:kubernetes.default.svc", "DNS:kubernetes.default.svc.cluster.local"]
    sans += [f"IP:{ip}" for ip in ["127.0.0.1", *apiserver_ips]]
    # The serving certificate names every address it is reached at; remake it if they changed.
    if (d / "apiserver.crt").exists() and cert_sans(d / "apiserver.crt") != set(sans):
        (d / "apiserver.crt").unlink()
    _leaf(d, "ca", "apiserver", "kube-apiserver", sans=sans, server=True)
    _leaf(d, "ca", "apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters")
    _leaf(d, "front-proxy-ca", "front-proxy-client", "front-proxy-client")
    for ident in client_identities(node_name):
        _leaf(d, "ca", ident.stem, ident.cn, ident.org)
    if node_name and node_ip:
        node_sans = [f"IP:{node_ip}", f"DNS:{node_name}", "DNS:localhost", "IP:127.0.0.1"]
        _leaf(d, "ca", "kubelet-serving", f"system:node:{node_name}", "system:nodes",
              sans=node_sans, server=True)  # fmt: skip
    if not (d / "sa.key").exists():
        _openssl("genrsa", "-out", str(d / "sa.key"), "2048")
        _openssl("rsa", "-in", str(d / "sa.key"), "-pubout", "-out", str(d / "sa.pub"))


def ensure_webhook_pki(d: Path, stem: str) -> None:
    """A serving certificate ``<stem>.crt``/``.key`` for an admission webhook that runs on the
    host, at 127.0.0.1, signed by the webhook CA ``webhook-ca.crt`` (idempotent). A CA of its
    own, not the cluster's: the apiserver trusts it only through the webhook configurations'
    ``caBundle``, and it can sign nothing the cluster's components would accept."""
    d.mkdir(parents=True, exist_ok=True)
    _ca(d, "webhook-ca", "gangjob-local-webhook-ca")
    _leaf(d, "webhook-ca", stem, f"{stem}.localcluster", sans=["IP:127.0.0.1", "DNS:localhost"],
          server=True)  # fmt: skip


def cert_sans(crt: Path) -> set[str]:
    """The subject alternative names of a certificate, as openssl's config spells them."""
    res = subprocess.run(
        ["openssl", "x509", "-in", str(crt), "-noout", "-ext", "subjectAltName"],
        capture_output=True,
        text=True,
    )
    names: set[str] = set()
    for item in res.stdout.replace("\n", ",").split(","):
        kind, _, value = item.strip().partition(":")
        if value:
            names.add(f"{'IP' if kind == 'IP Address' else kind}:{value}")
    return names


def client_identities(node_name: str | None) -> list[Identity]:
    ids = [
        Identity("admin", "kubernetes-admin", "system:masters"),
        Identity("controller-manager", "system:kube-controller-manager"),
        Identity("scheduler", "system:kube-scheduler"),
        # KWOK plays the kubelet of every simulated node: it needs to write any node and pod.
        Identity("kwok", "kwok-controller", "system:masters"),
    ]
    if node_name:
        ids.append(Identity("kubelet", f"system:node:{node_name}", "system:nodes"))
        # Bound to the ClusterRole system:node-proxier by the apiserver's bootstrap policy.
        ids.append(Identity("kube-proxy", "system:kube-proxy"))
    return ids


def write_kubeconfig(path: Path, pki: Path, server: str, stem: str, user: str) -> None:
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "gangjob-local",
                "cluster": {"server": server, "certificate-authority": str(pki / "ca.crt")},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate": str(pki / f"{stem}.crt"),
                    "client-key": str(pki / f"{stem}.key"),
                },
            }
        ],
        "contexts": [
            {"name": "gangjob-local", "context": {"cluster": "gangjob-local", "user": user}}
        ],
        "current-context": "gangjob-local",
    }
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
