"""manifests/default, as a user applies it (`kubectl apply -k manifests/default`), accepted by
the real apiserver: every object valid, the arrival Service selecting the leader's label, and
the controller's roles holding the verbs the arrival endpoint needs."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
import yaml

from localcluster.cluster import Cluster
from localcluster.controllerimage import CONTROLLER_IMAGE
from localcluster.node import AGENT_IMAGE
from localcluster.tools import REPO, kubectl

pytestmark = pytest.mark.integration


def test_manifests_apply_on_the_real_apiserver(sim_cluster: Cluster) -> None:
    default = str(REPO / "manifests" / "default")
    objects = list(yaml.safe_load_all(kubectl(sim_cluster, "kustomize", default)))
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert ("Service", "gangjob-arrivals") in kinds
    assert ("Deployment", "gangjob-controller") in kinds
    service = next(o for o in objects if o["metadata"]["name"] == "gangjob-arrivals")
    assert service["spec"]["selector"]["gangjob.io/arrivals"] == "leader"
    deploy = next(o for o in objects if o["kind"] == "Deployment")
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--arrival-url=https://gangjob-arrivals.gangjob-system.svc:8082" in args
    # Its own certificate's Secret: made empty, and the only Secret the controller may touch.
    secret = next(o for o in objects if o["kind"] == "Secret")
    assert secret["metadata"]["name"] == "gangjob-arrival-tls"
    assert "data" not in secret
    election = next(o for o in objects if o["kind"] == "Role")
    assert {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["gangjob-arrival-tls"],
            "verbs": ["get", "update"]} in election["rules"]  # fmt: skip
    role = next(o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"] ==
                "gangjob-controller")  # fmt: skip
    assert {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"],
            "verbs": ["create"]} in role["rules"]  # fmt: skip


def test_a_server_dry_run_on_a_cluster_without_the_namespace(
    sim_cluster: Cluster, tmp_path: Path
) -> None:
    """A server-side dry run validates every object, and the apiserver refuses a namespaced one
    whose namespace does not exist: a dry run creates none. docs/install.md says how: the
    namespace alone first (manifests/namespace), then the dry run. Here under a namespace name
    of this test's own, as on a cluster that never ran GangJob."""
    ns = f"gangjob-dry-{uuid.uuid4().hex[:6]}"
    overlays = {}
    for base in ("namespace", "default"):
        overlay = tmp_path / base
        overlay.mkdir()
        # kustomize takes no absolute path of a base.
        path = os.path.relpath(REPO / "manifests" / base, overlay)
        kustomization = {"resources": [path], "namespace": ns}
        (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        overlays[base] = str(overlay)
    with pytest.raises(RuntimeError, match=f'namespaces "{ns}" not found'):
        kubectl(sim_cluster, "apply", "-k", overlays["default"], "--dry-run=server")
    out = kubectl(sim_cluster, "apply", "--server-side", "-k", overlays["namespace"])
    assert out.strip() == f"namespace/{ns} serverside-applied"
    try:
        out = kubectl(sim_cluster, "apply", "-k", overlays["default"], "--dry-run=server")
        assert "service/gangjob-arrivals created (server dry run)" in out
        assert "deployment.apps/gangjob-controller created (server dry run)" in out
    finally:
        kubectl(sim_cluster, "delete", "namespace", ns, "--wait=false")


def _leaves(obj: object, path: str = "") -> dict[str, object]:
    """Every scalar of a manifest by its path (`spec.template...containers[0].image`)."""
    if isinstance(obj, dict):
        out: dict[str, object] = {}
        for k, v in obj.items():
            out.update(_leaves(v, f"{path}.{k}" if path else str(k)))
        return out
    if isinstance(obj, list):
        out = {}
        for i, v in enumerate(obj):
            out.update(_leaves(v, f"{path}[{i}]"))
        return out
    return {path: obj}


def test_the_local_overlay_changes_only_images_and_pull_policies(sim_cluster: Cluster) -> None:
    """What the e2e tests apply (manifests/local) is what users apply, but for the images that
    localcluster builds, which are never pulled."""

    def render(overlay: str) -> dict[tuple[str, str], dict[str, object]]:
        docs = yaml.safe_load_all(kubectl(sim_cluster, "kustomize", str(REPO / "manifests" /
                                                                         overlay)))  # fmt: skip
        return {(d["kind"], d["metadata"]["name"]): _leaves(d) for d in docs}

    default, local = render("default"), render("local")
    assert set(local) == set(default)
    changed = {
        (key, path): (default[key].get(path), local[key].get(path))
        for key in default
        for path in set(default[key]) | set(local[key])
        if default[key].get(path) != local[key].get(path)
    }
    container = "spec.template.spec.containers[0]"
    deploy = ("Deployment", "gangjob-controller")
    assert changed == {
        (deploy, f"{container}.image"): ("gangjob-controller:dev", CONTROLLER_IMAGE),
        (deploy, f"{container}.imagePullPolicy"): (None, "IfNotPresent"),
        (deploy, f"{container}.args[3]"): (
            "--agent-image=gangjob-agent:dev",
            f"--agent-image={AGENT_IMAGE}",
        ),
    }
