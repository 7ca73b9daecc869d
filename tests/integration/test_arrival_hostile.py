"""The arrival endpoint against hostile reports, its tokens checked by a real TokenReview on the
sim cluster's apiserver: tokens of another audience, bound to no pod, to another pod, to a pod
since deleted, or not tokens at all, and a report for a GangJob the pod is no worker of; each is
refused, and only the one good report is counted (the book, `gangjob_arrival_reports_total`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from agent.apiclient import ApiError, HttpClient
from api.constants import ARRIVAL_AUDIENCE, ARRIVALS_PATH, LABEL_NAME
from controller.arrivals.auth import TokenAuthenticator
from controller.arrivals.book import ArrivalBook
from controller.arrivals.server import arrivals_app
from controller.k8s import PODS, TOKENREVIEWS, JsonDict, Kube
from controller.k8s.kinds import ResourceKind
from controller.runtime.httpserver import HttpServer
from controller.runtime.metrics import REGISTRY
from localcluster.cluster import Cluster
from localcluster.procs import free_port
from localcluster.tools import kubectl
from tests.waiting import wait_gone

pytestmark = pytest.mark.integration

SERVICE_ACCOUNTS = ResourceKind("", "v1", "serviceaccounts", "ServiceAccount")
SA = "worker"
JOB, OTHER_JOB = "train", "other"


def reports(result: str) -> float:
    value = REGISTRY.get_sample_value("gangjob_arrival_reports_total", {"result": result})
    return value or 0.0


def pod(name: str) -> JsonDict:
    # A worker as far as the endpoint can tell (its gang label); no controller runs here.
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {LABEL_NAME: JOB}},
        "spec": {
            "serviceAccountName": SA,
            "containers": [{"name": "trainer", "image": "localhost/busybox:dev"}],
        },
    }


def token(cluster: Cluster, namespace: str, bound: JsonDict | None, audience: str) -> str:
    args = ["create", "token", SA, "-n", namespace, f"--audience={audience}"]
    if bound is not None:
        meta = bound["metadata"]
        args += ["--bound-object-kind=Pod", f"--bound-object-name={meta['name']}",
                 f"--bound-object-uid={meta['uid']}"]  # fmt: skip
    return kubectl(cluster, *args).strip()


@pytest.fixture
async def pods(sim_kube: Kube, namespace: str) -> dict[str, JsonDict]:
    await sim_kube.create(SERVICE_ACCOUNTS, {"metadata": {"name": SA}}, namespace)
    return {
        name: await sim_kube.create(PODS, pod(name), namespace)
        for name in ("worker-a", "worker-b", "worker-gone")
    }


@pytest.fixture
async def endpoint(
    sim_kube: Kube, namespace: str, pods: dict[str, JsonDict]
) -> AsyncIterator[tuple[str, ArrivalBook]]:
    """The endpoint as the manager serves it, with the real TokenReview."""
    book = ArrivalBook()
    jobs = {f"{namespace}/{name}": {"metadata": {"name": name}, "status": {"epoch": 0}}
            for name in (JOB, OTHER_JOB)}  # fmt: skip
    labels = {name: p["metadata"]["labels"][LABEL_NAME] for name, p in pods.items()}
    auth = TokenAuthenticator(lambda body: sim_kube.create(TOKENREVIEWS, body))
    app = arrivals_app(
        book,
        auth.authenticate,
        jobs.get,
        pod_job=lambda ns, name: labels.get(name) if ns == namespace else None,
        accepting=lambda: True,
        on_report=lambda key: None,
        lookup=auth.lookup,
    )
    # Through `HttpServer`, as the manager serves it: reports take the fast path
    # (controller.runtime.fastpath), refusals aiohttp's.
    port = free_port()
    async with HttpServer(app, "127.0.0.1", port):
        yield f"http://127.0.0.1:{port}", book


async def post(url: str, body: JsonDict, bearer: str) -> str:
    """'' once the report is accepted (its first state line read), else the refusal."""
    async with HttpClient(url) as client:
        try:
            async for _ in client.stream("POST", ARRIVALS_PATH, body, token=bearer):
                return ""
        except ApiError as e:
            return str(e)
    return "the stream ended with no line"


async def test_hostile_reports_are_refused_and_not_counted(
    sim_cluster: Cluster,
    sim_kube: Kube,
    namespace: str,
    pods: dict[str, JsonDict],
    endpoint: tuple[str, ArrivalBook],
) -> None:
    url, book = endpoint
    a, b, gone = pods["worker-a"], pods["worker-b"], pods["worker-gone"]

    def report(of: JsonDict, job: str = JOB) -> dict[str, Any]:
        meta = of["metadata"]
        return {"namespace": namespace, "job": job, "pod": meta["name"], "uid": meta["uid"],
                "epoch": 0, "exit": None}  # fmt: skip

    gone_token = token(sim_cluster, namespace, gone, ARRIVAL_AUDIENCE)
    await sim_kube.delete(PODS, "worker-gone", namespace, grace_period_seconds=0)
    await wait_gone(sim_kube, PODS, "worker-gone", namespace, timeout=30)

    hostile = {
        "another audience": (
            report(a), token(sim_cluster, namespace, a, "https://kubernetes.default.svc"),
            f'401 : is invalid for the target audiences ["{ARRIVAL_AUDIENCE}"]'),
        "bound to no pod": (
            report(a), token(sim_cluster, namespace, None, ARRIVAL_AUDIENCE),
            "401 : not a service-account token bound to a pod"),
        "malformed": (report(a), "not.a.token", "401 : invalid bearer token"),
        "another pod's": (
            report(a), token(sim_cluster, namespace, b, ARRIVAL_AUDIENCE),
            f"403 : the token is bound to pod {namespace}/worker-b"),
        "of a deleted pod": (report(gone), gone_token, "401 : token has been invalidated"),
        "for another job": (
            report(a, OTHER_JOB), token(sim_cluster, namespace, a, ARRIVAL_AUDIENCE),
            f"403 : pod {namespace}/worker-a is a worker of gangjob {namespace}/{JOB}, not of "
            f"{namespace}/{OTHER_JOB}"),
    }  # fmt: skip
    accepted = reports("accepted")
    wrong = {}
    for case, (body, bearer, expected) in hostile.items():
        answer = await post(url, body, bearer)
        if not answer.startswith("HTTP " + expected.split(" ")[0]) or (
            expected.split(" : ")[-1] not in answer
        ):
            wrong[case] = answer or "accepted"
    assert wrong == {}
    assert reports("accepted") == accepted
    assert [book.get(namespace, p) for p in ("worker-a", "worker-b", "worker-gone")] == [None] * 3

    # The one good report: worker-a's own token, for its own job.
    assert await post(url, report(a), token(sim_cluster, namespace, a, ARRIVAL_AUDIENCE)) == ""
    assert reports("accepted") == accepted + 1
    held = book.get(namespace, "worker-a")
    assert held is not None
    assert held.uid == a["metadata"]["uid"]
