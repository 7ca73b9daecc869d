"""Unit tests of controller.workeraccess against the in-memory API."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml

from api.constants import WORKER_ROLE_FILE
from controller.k8s import (
    CLUSTER_ROLES,
    SUBJECT_ACCESS_REVIEWS,
    AlreadyExists,
    ApiError,
    Forbidden,
    Invalid,
    JsonDict,
    ResourceKind,
    TransportError,
)
from controller.reconcile import refused
from controller.workeraccess import (
    ROLE_BINDINGS,
    SERVICE_ACCOUNTS,
    AccessReview,
    WorkerAccess,
    check_worker_role,
    missing_permissions,
    missing_service_account,
    role_binding,
)
from tests.unit.fakes import FakeApi, FakeClock

REPO = Path(__file__).resolve().parents[2]


async def test_creates_the_service_account_and_binding_once() -> None:
    api, access = FakeApi(), WorkerAccess()
    await access.ensure(api, "ml")
    sa = api.objects[(SERVICE_ACCOUNTS.resource, "ml", "gangjob-worker")]
    binding = api.objects[(ROLE_BINDINGS.resource, "ml", "gangjob-worker")]
    assert sa["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "gangjob-controller"}
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "gangjob-worker",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gangjob-worker", "namespace": "ml"}
    ]
    assert api.calls == ["create", "create"]
    await access.ensure(api, "ml")
    assert api.calls == ["create", "create"]  # free from then on
    await access.ensure(api, "other")
    assert len(api.calls) == 4


async def test_existing_objects_are_left_alone() -> None:
    api, access = FakeApi(), WorkerAccess()
    mine = role_binding("ml")
    mine["metadata"]["labels"] = {"shaped": "by-admin"}
    await api.create(ROLE_BINDINGS, mine, "ml")
    await access.ensure(api, "ml")
    assert access.done("ml")
    stored = api.objects[(ROLE_BINDINGS.resource, "ml", "gangjob-worker")]
    assert stored["metadata"]["labels"] == {"shaped": "by-admin"}


async def test_a_failure_is_not_remembered() -> None:
    api, access = FakeApi(), WorkerAccess()
    api.down_after_calls = 1
    with pytest.raises(TransportError):
        await access.ensure(api, "ml")
    assert not access.done("ml")
    api.down, api.down_after_calls = False, None
    await access.ensure(api, "ml")
    assert access.done("ml")


async def test_forget_checks_again() -> None:
    api, access = FakeApi(), WorkerAccess()
    await access.ensure(api, "ml")
    del api.objects[(SERVICE_ACCOUNTS.resource, "ml", "gangjob-worker")]
    access.forget("ml")
    await access.ensure(api, "ml")
    assert (SERVICE_ACCOUNTS.resource, "ml", "gangjob-worker") in api.objects


def test_missing_service_account() -> None:
    message = (
        "error looking up service account ml/gangjob-worker: "
        'serviceaccount "gangjob-worker" not found'
    )
    assert missing_service_account(Forbidden(403, "Forbidden", message))
    assert not missing_service_account(Forbidden(403, "Forbidden", "pods is forbidden: User"))
    assert not missing_service_account(AlreadyExists(409, "AlreadyExists", message))


# --- what the agents may do: AccessReview, check_worker_role --------------------------------


class Authorizer(FakeApi):
    """Answers SubjectAccessReviews as RBAC would for the worker role: allowed in a namespace
    that has the RoleBinding `gangjob-worker`, while the ClusterRole exists (`role`)."""

    def __init__(self) -> None:
        super().__init__()
        self.role = True
        self.refuse_reviews = False

    async def create(
        self,
        kind: ResourceKind,
        obj: JsonDict,
        namespace: str | None = None,
        *,
        request_timeout: float | None = None,
        retry: bool = True,
    ) -> JsonDict:
        if kind is not SUBJECT_ACCESS_REVIEWS:
            return await super().create(kind, obj, namespace)
        self._check("review")
        if self.refuse_reviews:
            raise Forbidden(403, "Forbidden", "subjectaccessreviews is forbidden")
        ns = obj["spec"]["resourceAttributes"]["namespace"]
        bound = (ROLE_BINDINGS.resource, ns, "gangjob-worker") in self.objects
        return {**obj, "status": {"allowed": self.role and bound}}


async def reviewed(api: Authorizer, **kw: Any) -> tuple[AccessReview, WorkerAccess]:
    access = WorkerAccess()
    await access.ensure(api, "ml")
    api.calls.clear()
    return AccessReview(api, access=access, **kw), access


async def test_nothing_is_reviewed_before_the_controller_made_the_namespaces_access() -> None:
    api = Authorizer()
    api.role = False
    review = AccessReview(api, access=WorkerAccess())
    assert await review.denied("ml", "gangjob-worker") == ()
    assert api.calls == []


async def test_the_worker_role_in_place_denies_nothing_and_is_asked_once_per_ttl() -> None:
    api = Authorizer()
    clock = FakeClock()
    changed: list[str] = []
    review, _ = await reviewed(api, ttl=30, clock=clock.now, on_change=changed.append)
    assert await review.denied("ml", "gangjob-worker") == ()
    assert api.calls == ["review"] * 5
    assert await review.denied("ml", "gangjob-worker") == ()
    assert len(api.calls) == 5  # cached
    clock.advance(31)
    api.role = False
    # Past the ttl the last answer serves at once, while the next is asked.
    assert await review.denied("ml", "gangjob-worker") == ()
    assert await review.denied("ml", "gangjob-worker") == ()
    await asyncio.sleep(0.01)
    assert changed == ["ml"]  # one review ran, not two
    assert await review.denied("ml", "gangjob-worker") == (
        "get pods",
        "patch pods",
        "get gangjobs",
        "list gangjobs",
        "watch gangjobs",
    )
    # The same answer again is no change.
    clock.advance(31)
    await review.denied("ml", "gangjob-worker")
    await asyncio.sleep(0.01)
    assert changed == ["ml"]


async def test_a_missing_cluster_role_is_denied_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = Authorizer()
    api.role = False
    clock = FakeClock()
    review, _ = await reviewed(api, ttl=30, clock=clock.now)
    assert "get pods" in await review.denied("ml", "gangjob-worker")
    clock.advance(31)
    assert "get pods" in await review.denied("ml", "gangjob-worker")
    await asyncio.sleep(0.01)  # the review past the ttl
    logged = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(logged) == 1
    assert "ServiceAccount gangjob-worker, which may not get pods" in logged[0]
    assert "manifests/rbac/worker_role.yaml" in logged[0]


async def test_a_deleted_role_binding_is_made_again_rather_than_reported() -> None:
    api = Authorizer()
    review, access = await reviewed(api)
    del api.objects[(ROLE_BINDINGS.resource, "ml", "gangjob-worker")]
    assert await review.denied("ml", "gangjob-worker") == ()
    assert (ROLE_BINDINGS.resource, "ml", "gangjob-worker") in api.objects
    assert access.done("ml")


async def test_a_template_service_account_is_reviewed_as_it_is() -> None:
    api = Authorizer()
    review = AccessReview(api, access=WorkerAccess())
    assert await review.denied("ml", "trainer-sa") == WORKER_PERMISSION_TEXTS
    assert (ROLE_BINDINGS.resource, "ml", "gangjob-worker") not in api.objects


async def test_without_the_right_to_review_nothing_is_reported_and_nothing_asked_again() -> None:
    api = Authorizer()
    api.refuse_reviews = True
    review, _ = await reviewed(api)
    assert await review.denied("ml", "gangjob-worker") == ()
    calls = len(api.calls)
    assert await review.denied("ml", "gangjob-worker") == ()
    assert len(api.calls) == calls


async def test_an_unreachable_apiserver_keeps_the_last_answer() -> None:
    api = Authorizer()
    api.role = False
    clock = FakeClock()
    review, _ = await reviewed(api, ttl=30, clock=clock.now)
    denied = await review.denied("ml", "gangjob-worker")
    assert denied
    clock.advance(31)
    api.down = True
    assert await review.denied("ml", "gangjob-worker") == denied
    await asyncio.sleep(0.01)  # the review past the ttl fails
    assert await review.denied("ml", "gangjob-worker") == denied


def test_the_worker_role_grants_what_the_agents_need() -> None:
    role = yaml.safe_load((REPO / WORKER_ROLE_FILE).read_text())
    assert missing_permissions(role["rules"]) == ()
    assert missing_permissions([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]) == ()
    narrowed = [dict(rule) for rule in role["rules"]]
    narrowed[1] = {**narrowed[1], "verbs": ["get"]}
    assert missing_permissions(narrowed) == ("patch pods",)
    named = [{**rule, "resourceNames": ["one"]} for rule in role["rules"]]
    assert len(missing_permissions(named)) == 5


async def test_start_up_says_when_the_worker_role_is_missing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = Authorizer()
    assert await check_worker_role(api) == WORKER_PERMISSION_TEXTS
    assert "ClusterRole gangjob-worker not found" in caplog.text
    assert "kubectl apply -f manifests/rbac/worker_role.yaml" in caplog.text
    role = yaml.safe_load((REPO / WORKER_ROLE_FILE).read_text())
    await api.create(CLUSTER_ROLES, role)
    assert await check_worker_role(api) == ()


WORKER_PERMISSION_TEXTS = (
    "get pods",
    "patch pods",
    "get gangjobs",
    "list gangjobs",
    "watch gangjobs",
)


def test_a_refused_creation_is_told_from_a_transient_failure() -> None:
    quota = Forbidden(403, "Forbidden", 'pods "x" is forbidden: exceeded quota: q')
    assert refused(quota)
    assert refused(Invalid(422, "Invalid", "spec.containers[0].image: Required value"))
    assert refused(ApiError(400, "BadRequest", 'admission webhook "w" denied the request'))
    assert not refused(TransportError("connection refused"))
    assert not refused(ApiError(429, "TooManyRequests", "slow down"))
    assert not refused(ApiError(500, "InternalError", "etcd"))
    assert not refused(AlreadyExists(409, "AlreadyExists", "x"))
