"""What the e2e tests share: the real controller against the `node` cluster, one per test,
watching only the test's namespace, with the CRD, RBAC and admission policy of manifests/."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from localcluster.cluster import Cluster
from localcluster.node import AGENT_IMAGE, Bridge, ensure_trainer_image
from localcluster.tools import REPO, ControllerProcess, controller_kubeconfig, install_crd, kubectl


@pytest.fixture(scope="module")
def trainer_image(node_cluster: Cluster) -> str:
    """The PyTorch trainer image with the samples (manifests/samples/ddp), on the node."""
    return ensure_trainer_image(node_cluster, sys.stderr)


@pytest.fixture(scope="module")
def node_controller_kubeconfig(node_cluster: Cluster) -> Path:
    install_crd(node_cluster)
    kubectl(node_cluster, "apply", "-k", str(REPO / "manifests" / "policy"))
    return controller_kubeconfig(node_cluster)


@pytest.fixture
async def controller(
    node_cluster: Cluster, node_controller_kubeconfig: Path, node_namespace: str, tmp_path: Path
) -> AsyncIterator[ControllerProcess]:
    # Agents report arrivals to the controller, as deployed: the pods reach it on the bridge's
    # gateway address (the controller runs on this host, not in a pod), with the token the
    # kubelet projects for the audience gangjob.io/arrival.
    ctl = ControllerProcess(
        node_controller_kubeconfig,
        [f"--namespace={node_namespace}", f"--agent-image={AGENT_IMAGE}"],
        tmp_path / "controller.log",
        arrivals=True,
        arrival_host=Bridge.for_slot(node_cluster.ports.slot).gateway,
    )
    ctl.start()
    try:
        yield ctl
    finally:
        ctl.stop()
        print(ctl.logs()[-5000:])
