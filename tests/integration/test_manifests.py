"""manifests/default, as a user applies it (`kubectl apply -k manifests/default`), accepted by
the real apiserver: every object valid, the arrival Service selecting the leader's label, and
the controller's roles holding the verbs the arrival endpoint needs."""

from __future__ import annotations

import pytest
import yaml

from localcluster.cluster import Cluster
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
    assert "--arrival-url=http://gangjob-arrivals.gangjob-system.svc:8082" in args
    role = next(o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"] ==
                "gangjob-controller")  # fmt: skip
    assert {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"],
            "verbs": ["create"]} in role["rules"]  # fmt: skip

    # A dry run on the server validates every object; the namespace must exist for that. It is
    # the one the controller tests use (localcluster.tools.SYSTEM_NS): made if missing, kept.
    ns = kubectl(sim_cluster, "create", "namespace", "gangjob-system", "--dry-run=client", "-o",
                 "yaml")  # fmt: skip
    kubectl(sim_cluster, "apply", "-f", "-", stdin=ns)
    out = kubectl(sim_cluster, "apply", "-k", default, "--dry-run=server")
    assert "service/gangjob-arrivals created (server dry run)" in out
    assert "deployment.apps/gangjob-controller created (server dry run)" in out
