"""charts/gangjob, rendered and installed with the pinned helm (localcluster.helm): it renders
exactly manifests/default (but the Namespace, which `helm install --create-namespace` makes),
its values reach the objects they name, and `helm install`, `upgrade` and `uninstall` work on
the sim cluster and leave nothing behind."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster.cluster import Cluster
from localcluster.helm import helm
from localcluster.tools import REPO, kubectl, wait_crd_established
from localcluster.versions import KUBERNETES_VERSION, binary

pytestmark = pytest.mark.integration

CHART = str(REPO / "charts" / "gangjob")
RELEASE = "gangjob"
Obj = dict[str, Any]


def render(namespace: str = "gangjob-system", *sets: str) -> dict[tuple[str, str], Obj]:
    args = ["template", RELEASE, CHART, "-n", namespace, "--kube-version", KUBERNETES_VERSION]
    for s in sets:
        args += ["--set", s]
    return _by_key(yaml.safe_load_all(helm(None, *args)))


def _by_key(docs: Any) -> dict[tuple[str, str], Obj]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs if d}


def kustomize(overlay: str) -> dict[tuple[str, str], Obj]:
    out = subprocess.run(
        [str(binary("kubectl").path), "kustomize", str(REPO / "manifests" / overlay)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return _by_key(yaml.safe_load_all(out))


def manager(objects: dict[tuple[str, str], Obj]) -> Obj:
    container: Obj = objects[("Deployment", "gangjob-controller")]["spec"]["template"]["spec"][
        "containers"
    ][0]
    return container


def test_the_chart_renders_manifests_default() -> None:
    chart, default = render(), kustomize("default")
    # And, by default, the dashboard of manifests/monitoring (test_the_chart_renders_monitoring).
    default[("ConfigMap", "gangjob-dashboard")] = kustomize("monitoring")[
        ("ConfigMap", "gangjob-dashboard")
    ]
    namespace = default.pop(("Namespace", "gangjob-system"))
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert sorted(chart) == sorted(default)
    for key, obj in default.items():
        assert chart[key] == obj, key


def test_node_quarantine_is_an_option_with_its_rbac_in_the_chart_and_kustomize() -> None:
    # On, the chart renders exactly manifests/quarantine; off (the default), nothing of it:
    # the controller may not patch nodes at all.
    chart, overlay = render("gangjob-system", "quarantine.enabled=true"), kustomize("quarantine")
    overlay.pop(("Namespace", "gangjob-system"))
    dashboard = ("ConfigMap", "gangjob-dashboard")  # the chart's by default (manifests/monitoring)
    overlay[dashboard] = kustomize("monitoring")[dashboard]
    assert sorted(chart) == sorted(overlay)
    for key, obj in overlay.items():
        assert chart[key] == obj, key
    assert "--quarantine-nodes" in manager(chart)["args"]
    role = chart[("ClusterRole", "gangjob-controller-quarantine")]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]}]
    for objs in (render(), kustomize("default")):
        assert not [a for a in manager(objs)["args"] if a.startswith("--quarantine")]
        patching = [
            key for key, o in objs.items() if o["kind"] == "ClusterRole"
            for rule in o["rules"] if "nodes" in rule["resources"] and "patch" in rule["verbs"]
        ]  # fmt: skip
        assert patching == []
    tuned = render(
        "gangjob-system", "quarantine.enabled=true", "quarantine.threshold=2",
        "quarantine.windowSeconds=600", "quarantine.seconds=900", "quarantine.maxShare=0.1",
    )  # fmt: skip
    assert [a for a in manager(tuned)["args"] if a.startswith("--quarantine")] == [
        "--quarantine-nodes", "--quarantine-threshold=2", "--quarantine-window-seconds=600",
        "--quarantine-seconds=900", "--quarantine-max-share=0.1",
    ]  # fmt: skip


def test_the_chart_renders_monitoring() -> None:
    """The dashboard ConfigMap and (when asked for) the PrometheusRule, as kustomize has them."""
    monitoring = kustomize("monitoring")
    chart = render("gangjob-system", "monitoring.prometheusRule.enabled=true")
    for key in [("ConfigMap", "gangjob-dashboard"), ("PrometheusRule", "gangjob")]:
        assert chart[key] == monitoring[key], key
    dashboard = json.loads(chart[("ConfigMap", "gangjob-dashboard")]["data"]["gangjob.json"])
    assert dashboard["uid"] == "gangjob"
    assert ("PrometheusRule", "gangjob") not in render()
    assert ("ConfigMap", "gangjob-dashboard") not in render(
        "gangjob-system", "monitoring.dashboard.enabled=false"
    )


def test_helm_lint_finds_nothing_wrong() -> None:
    out = helm(None, "lint", CHART, "--strict", "--kube-version", KUBERNETES_VERSION)
    assert "1 chart(s) linted, 0 chart(s) failed" in out


def test_the_values_reach_the_objects_they_name() -> None:
    objs = render(
        "ml-platform",
        "image.repository=registry.example/gangjob-controller",
        "image.tag=v0.1.0",
        "image.pullPolicy=Always",
        "agentImage=registry.example/gangjob-agent:v0.1.0",
        "replicas=3",
        "resources.requests.cpu=500m",
        "resources.limits.memory=2Gi",
        "logLevel=debug",
        "watchNamespace=team-a",
        "arrivals.port=9000",
        "installCRD=false",
    )
    deploy = objs[("Deployment", "gangjob-controller")]
    assert deploy["spec"]["replicas"] == 3
    c = manager(objs)
    assert c["image"] == "registry.example/gangjob-controller:v0.1.0"
    assert c["imagePullPolicy"] == "Always"
    assert c["resources"] == {"requests": {"cpu": "500m", "memory": "128Mi"},
                              "limits": {"memory": "2Gi"}}  # fmt: skip
    args = c["args"]
    assert "--agent-image=registry.example/gangjob-agent:v0.1.0" in args
    assert "--log-level=debug" in args
    assert "--namespace=team-a" in args
    # The Lease stays where the Role grants it, not in the watched namespace.
    assert "--leader-election-namespace=ml-platform" in args
    assert "--arrival-bind-address=:9000" in args
    assert "--arrival-url=https://gangjob-arrivals.ml-platform.svc:9000" in args
    arrivals = objs[("Service", "gangjob-arrivals")]
    assert arrivals["spec"]["ports"] == [{"name": "arrivals", "port": 9000,
                                          "targetPort": "arrivals"}]  # fmt: skip
    assert ("CustomResourceDefinition", "gangjobs.gangjob.io") not in objs
    binding = objs[("ClusterRoleBinding", "gangjob-controller")]
    assert binding["subjects"][0]["namespace"] == "ml-platform"

    off = render("gangjob-system", "arrivals.enabled=false")
    assert ("Service", "gangjob-arrivals") not in off
    assert not [a for a in manager(off)["args"] if a.startswith("--arrival")]
    assert [p["name"] for p in manager(off)["ports"]] == ["metrics", "health"]
    assert ("Secret", "gangjob-arrival-tls") not in off


def _secret_rules(objs: dict[tuple[str, str], Obj]) -> list[Obj]:
    role = objs[("Role", "gangjob-leader-election")]
    return [r for r in role["rules"] if "secrets" in r["resources"]]


def test_arrivals_are_served_over_tls_by_default_with_the_controllers_own_certificate() -> None:
    objs = render("ml-platform")
    args = manager(objs)["args"]
    assert "--arrival-url=https://gangjob-arrivals.ml-platform.svc:8082" in args
    assert not [a for a in args if a.startswith("--arrival-tls")]  # its own, default Secret
    # The chart makes the Secret (uninstall removes it); the controller may only read and
    # update that one.
    secret = objs[("Secret", "gangjob-arrival-tls")]
    assert secret["type"] == "Opaque"
    assert "data" not in secret
    assert _secret_rules(objs) == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["gangjob-arrival-tls"],
         "verbs": ["get", "update"]}
    ]  # fmt: skip
    named = render("ml-platform", "arrivals.tls.secretName=arrivals-cert")
    assert "--arrival-tls-secret=arrivals-cert" in manager(named)["args"]
    assert ("Secret", "arrivals-cert") in named
    assert _secret_rules(named)[0]["resourceNames"] == ["arrivals-cert"]
    # Plain HTTP only when asked for: no Secret, no access to one.
    plain = render("ml-platform", "arrivals.tls.enabled=false")
    assert "--arrival-url=http://gangjob-arrivals.ml-platform.svc:8082" in manager(plain)["args"]
    assert ("Secret", "gangjob-arrival-tls") not in plain
    assert _secret_rules(plain) == []


def test_arrivals_can_be_served_with_a_cert_manager_certificate() -> None:
    objs = render(
        "ml-platform",
        "arrivals.tls.certManager.enabled=true",
        "arrivals.tls.certManager.issuerRef.name=my-ca",
        "arrivals.tls.certManager.issuerRef.kind=ClusterIssuer",
    )
    cert = objs[("Certificate", "gangjob-arrivals")]
    assert cert["spec"]["secretName"] == "gangjob-arrival-tls"
    assert cert["spec"]["issuerRef"] == {"name": "my-ca", "kind": "ClusterIssuer"}
    assert cert["spec"]["dnsNames"][0] == "gangjob-arrivals.ml-platform.svc"
    c = manager(objs)
    tls_dir = "/var/run/secrets/gangjob.io/arrival-tls"
    for flag, key in (("cert", "tls.crt"), ("key", "tls.key"), ("ca", "ca.crt")):
        assert f"--arrival-tls-{flag}-file={tls_dir}/{key}" in c["args"]
    assert c["volumeMounts"] == [{"name": "arrival-tls", "mountPath": tls_dir, "readOnly": True}]
    pod = objs[("Deployment", "gangjob-controller")]["spec"]["template"]["spec"]
    assert pod["volumes"] == [
        {"name": "arrival-tls", "secret": {"secretName": "gangjob-arrival-tls"}}
    ]
    # cert-manager makes and owns the Secret: the chart neither makes it nor lets the controller
    # touch it (the kubelet mounts it).
    assert ("Secret", "gangjob-arrival-tls") not in objs
    assert _secret_rules(objs) == []


def _ref(obj: Obj) -> str:
    """`kubectl get` spelling of an object: Kind.version.group/name."""
    group, _, version = obj["apiVersion"].rpartition("/")
    kind = obj["kind"] if not group else f"{obj['kind']}.{version}.{group}"
    return f"{kind}/{obj['metadata']['name']}"


def _present(cluster: Cluster, objs: list[Obj], namespace: str) -> list[str]:
    found = []
    for obj in objs:
        ns = ["-n", namespace] if obj["metadata"].get("namespace") else []
        out = kubectl(cluster, "get", _ref(obj), *ns, "--ignore-not-found", "-o", "name")
        if out.strip():
            found.append(out.strip())
    return found


@pytest.fixture
def cluster_objects_set_aside(sim_cluster: Cluster) -> Iterator[list[Obj]]:
    """The chart's cluster-scoped objects (CRD, ClusterRoles, admission policy) exist in the
    shared sim cluster already, applied by other tests without helm's ownership: helm would
    refuse to install over them. They are taken out for the test and put back after it."""
    objs = [o for o in render().values() if not o["metadata"].get("namespace")]
    saved: list[Obj] = []
    for obj in objs:
        out = kubectl(sim_cluster, "get", _ref(obj), "--ignore-not-found", "-o", "json")
        if out.strip():
            live = json.loads(out)
            meta = live["metadata"]
            live["metadata"] = {k: meta[k] for k in ("name", "labels", "annotations") if k in meta}
            live.pop("status", None)
            saved.append(live)
            kubectl(sim_cluster, "delete", _ref(obj), "--wait", "--timeout=120s", timeout=150)
    try:
        yield objs
    finally:
        if saved:
            items = json.dumps({"apiVersion": "v1", "kind": "List", "items": saved})
            kubectl(sim_cluster, "apply", "--server-side", "--force-conflicts", "-f", "-",
                    stdin=items)  # fmt: skip
            wait_crd_established(sim_cluster)


def test_helm_install_upgrade_and_uninstall_leave_nothing_behind(
    sim_cluster: Cluster, namespace: str, cluster_objects_set_aside: list[Obj], tmp_path: Path
) -> None:
    ns = namespace
    objs = list(render(ns).values())
    helm(sim_cluster, "install", RELEASE, CHART, "-n", ns, "--wait", "--timeout=180s")
    present = _present(sim_cluster, objs, ns)
    # With the dashboard, both admission policies and the arrival certificate's Secret.
    assert len(present) == len(objs) == 16
    wait_crd_established(sim_cluster)
    deploy = json.loads(kubectl(sim_cluster, "-n", ns, "get", "deploy/gangjob-controller",
                                "-o", "json"))  # fmt: skip
    assert deploy["status"].get("readyReplicas") == 2

    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"replicas": 1, "logLevel": "debug"}))
    helm(sim_cluster, "upgrade", RELEASE, CHART, "-n", ns, "-f", str(values), "--wait",
         "--timeout=180s")  # fmt: skip
    deploy = json.loads(kubectl(sim_cluster, "-n", ns, "get", "deploy/gangjob-controller",
                                "-o", "json"))  # fmt: skip
    assert deploy["spec"]["replicas"] == 1
    assert "--log-level=debug" in deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    (release,) = json.loads(helm(sim_cluster, "list", "-n", ns, "-o", "json"))
    assert (release["name"], release["revision"], release["status"]) == (RELEASE, "2", "deployed")

    helm(sim_cluster, "uninstall", RELEASE, "-n", ns, "--wait", "--timeout=180s")
    assert _present(sim_cluster, objs, ns) == []
    # helm's own record of the release goes too.
    assert kubectl(sim_cluster, "-n", ns, "get", "secrets", "-l", "owner=helm", "-o",
                   "name").strip() == ""  # fmt: skip
    assert json.loads(helm(sim_cluster, "list", "-n", ns, "-a", "-o", "json")) == []
