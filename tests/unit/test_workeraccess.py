"""Unit tests of controller.workeraccess against the in-memory API."""

from __future__ import annotations

import pytest

from controller.k8s import AlreadyExists, Forbidden, TransportError
from controller.workeraccess import (
    ROLE_BINDINGS,
    SERVICE_ACCOUNTS,
    WorkerAccess,
    missing_service_account,
    role_binding,
)
from tests.unit.fakes import FakeApi


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
