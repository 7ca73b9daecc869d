"""Test tiers and their clusters.

Tests run against clusters of their own, named ``test-sim`` and ``test-node`` (the prefix is
``$GANGJOB_TEST_CLUSTERS`` when set), started through
``localcluster`` on ports of their own; they never read the user's KUBECONFIG. A test cluster
that is already up (a developer's ``localcluster up --name test-sim`` for quick iterations) is
reused and left running; one this session started is stopped at its end, unless
GANGJOB_KEEP_CLUSTERS=1. Each test gets a fresh namespace, deleted afterwards.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import sys
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from hypothesis import settings

from controller.k8s import NAMESPACES, PODS, Kube, NotFound
from localcluster import prebuild
from localcluster.cluster import Cluster, Options

# No per-example deadline: a property is about outcomes, and an example's time on a shared,
# loaded machine is noise (a timed assertion in disguise).
settings.register_profile("gangjob", deadline=None)
settings.load_profile("gangjob")

# GANGJOB_TEST_CLUSTERS=<prefix> gives a run clusters of its own (`<prefix>-sim`, `<prefix>-node`),
# so that two test runs on one machine do not share (and stop) each other's clusters.
CLUSTER_PREFIX = os.environ.get("GANGJOB_TEST_CLUSTERS", "test")
SIM_NAME = f"{CLUSTER_PREFIX}-sim"
NODE_NAME = f"{CLUSTER_PREFIX}-node"
# What the integration tests need of the simulated cluster: a few nodes, with GPUs to lose.
# Both run with KEP-4671 gang scheduling on; tests/integration/test_gates_off.py covers a
# cluster without it.
SIM_OPTIONS = Options(profile="sim", nodes=4, gpus_per_node=8, gang_scheduling=True)
NODE_OPTIONS = Options(profile="node", nodes=1, gang_scheduling=True)


def pytest_collection_finish(session: pytest.Session) -> None:
    """The binaries the selected tests run (Kubernetes, helm, Kueue, JobSet), built before the
    first test: a cold build inside a test would run under its timeout."""
    if not session.config.option.collectonly:
        prebuild.build_for((item.path for item in session.items), sys.stderr)


@pytest.fixture(scope="session", autouse=True)
def _ignore_user_kubeconfig() -> Iterator[None]:
    """Nothing in a test may reach the user's own cluster by accident."""
    saved = os.environ.pop("KUBECONFIG", None)
    yield
    if saved is not None:
        os.environ["KUBECONFIG"] = saved


def _session_cluster(name: str, opts: Options) -> Iterator[Cluster]:
    cluster = Cluster(name)
    started = not cluster.is_up()
    cluster.up(opts, sys.stderr)
    try:
        yield cluster
    finally:
        if started and os.environ.get("GANGJOB_KEEP_CLUSTERS") != "1":
            cluster.down(sys.stderr)


@pytest.fixture(scope="session")
def sim_cluster() -> Iterator[Cluster]:
    """The `sim` profile: real etcd, apiserver, controller-manager, scheduler; KWOK nodes."""
    yield from _session_cluster(SIM_NAME, SIM_OPTIONS)


@pytest.fixture(scope="session")
def sim_kubeconfig(sim_cluster: Cluster) -> pathlib.Path:
    return sim_cluster.kubeconfig


@pytest.fixture(scope="session")
def node_cluster() -> Iterator[Cluster]:
    """The `node` profile: the same control plane plus one real kubelet with containerd."""
    if os.geteuid() != 0:
        pytest.fail("e2e tests run a real kubelet and containerd: run them as root")
    yield from _session_cluster(NODE_NAME, NODE_OPTIONS)


@pytest.fixture(scope="session")
def node_kubeconfig(node_cluster: Cluster) -> pathlib.Path:
    return node_cluster.kubeconfig


async def _fresh_namespace(kubeconfig: pathlib.Path, request: pytest.FixtureRequest) -> str:
    base = "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:40].strip("-")
    name = f"{base}-{uuid.uuid4().hex[:6]}"
    async with await Kube.from_kubeconfig(kubeconfig, request_timeout=10) as kube:
        await kube.create(NAMESPACES, {"metadata": {"name": name, "labels": {"gangjob-test": "1"}}})
    return name


async def _drop_namespace(kubeconfig: pathlib.Path, name: str) -> None:
    async with await Kube.from_kubeconfig(kubeconfig, request_timeout=10) as kube:
        # Pods on KWOK nodes whose deletion the simulated kubelet finishes (KWOK leaves them
        # alone) would stay Terminating once the test's simulation is gone, and the namespace
        # with them: they go at once, as a kubelet that confirmed their end would let them.
        for pod in (await kube.list(PODS, name)).items:
            with contextlib.suppress(NotFound):
                await kube.delete(PODS, pod["metadata"]["name"], name, grace_period_seconds=0)
        with contextlib.suppress(NotFound):
            await kube.delete(NAMESPACES, name, propagation_policy="Background")


@pytest.fixture
async def namespace(
    sim_kubeconfig: pathlib.Path, request: pytest.FixtureRequest
) -> AsyncIterator[str]:
    """A fresh namespace in the sim cluster, deleted after the test."""
    name = await _fresh_namespace(sim_kubeconfig, request)
    yield name
    await _drop_namespace(sim_kubeconfig, name)


@pytest.fixture
async def node_namespace(
    node_kubeconfig: pathlib.Path, request: pytest.FixtureRequest
) -> AsyncIterator[str]:
    """A fresh namespace in the node cluster, deleted after the test."""
    name = await _fresh_namespace(node_kubeconfig, request)
    yield name
    await _drop_namespace(node_kubeconfig, name)


@pytest.fixture
async def sim_kube(sim_kubeconfig: pathlib.Path) -> AsyncIterator[Kube]:
    async with await Kube.from_kubeconfig(sim_kubeconfig, request_timeout=10) as kube:
        yield kube


@pytest.fixture
async def node_kube(node_kubeconfig: pathlib.Path) -> AsyncIterator[Kube]:
    async with await Kube.from_kubeconfig(node_kubeconfig, request_timeout=10) as kube:
        yield kube
