"""The Secret holding the arrival endpoint's own certificate (controller/servingsecret.py), on
the in-memory apiserver: made when missing, filled when the installer made it empty, renewed
when due, and two replicas renewing at once agree on one certificate."""

from __future__ import annotations

import base64
import datetime
from collections.abc import Mapping

from controller.k8s import SECRETS
from controller.runtime.certs import CA_CERT, TLS_CERT, service_names
from controller.servingsecret import ServingSecret
from tests.unit.fakes import FakeApi

NS, NAME = "gangjob-system", "gangjob-arrival-tls"
NAMES = service_names("gangjob-arrivals.gangjob-system.svc")
T0 = datetime.datetime(2026, 11, 27, 12, 0, tzinfo=datetime.UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime.datetime:
        return self.now


def keeper(api: FakeApi, clock: Clock, seen: list[Mapping[str, bytes]]) -> ServingSecret:
    return ServingSecret(api, NS, NAME, NAMES, seen.append, clock=clock)


def stored(api: FakeApi) -> dict[str, bytes]:
    secret = api.objects[("secrets", NS, NAME)]
    return {k: base64.b64decode(v) for k, v in secret["data"].items()}


async def test_a_missing_secret_is_made_and_its_data_handed_over() -> None:
    api, clock = FakeApi(), Clock()
    seen: list[Mapping[str, bytes]] = []
    data = await keeper(api, clock, seen).ensure()
    assert stored(api) == data
    assert seen == [data]
    assert api.objects[("secrets", NS, NAME)]["type"] == "Opaque"


async def test_the_empty_secret_of_the_chart_is_filled_its_metadata_kept() -> None:
    api, clock = FakeApi(), Clock()
    seen: list[Mapping[str, bytes]] = []
    made_by_helm = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": NAME,
            "labels": {"app.kubernetes.io/managed-by": "Helm"},
            "annotations": {"meta.helm.sh/release-name": "gangjob"},
        },
        "type": "Opaque",
    }
    await api.create(SECRETS, made_by_helm, NS)
    data = await keeper(api, clock, seen).ensure()
    secret = api.objects[("secrets", NS, NAME)]
    assert secret["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "Helm"}
    assert secret["metadata"]["annotations"] == {"meta.helm.sh/release-name": "gangjob"}
    assert stored(api) == data


async def test_nothing_is_written_while_the_certificate_is_fresh() -> None:
    api, clock = FakeApi(), Clock()
    seen: list[Mapping[str, bytes]] = []
    k = keeper(api, clock, seen)
    await k.ensure()
    writes = [c for c in api.calls if c != "get"]
    clock.now += datetime.timedelta(days=30)
    await k.ensure()
    assert [c for c in api.calls if c != "get"] == writes
    assert len(seen) == 1


async def test_a_due_certificate_is_renewed_the_ca_kept_and_the_change_handed_over() -> None:
    api, clock = FakeApi(), Clock()
    seen: list[Mapping[str, bytes]] = []
    k = keeper(api, clock, seen)
    first = await k.ensure()
    clock.now += datetime.timedelta(days=61)
    second = await k.ensure()
    assert second[TLS_CERT] != first[TLS_CERT]
    assert second[CA_CERT] == first[CA_CERT]
    assert seen == [first, second]
    assert stored(api) == second


async def test_another_replicas_renewal_is_taken_not_overwritten() -> None:
    api, clock = FakeApi(), Clock()
    seen_a: list[Mapping[str, bytes]] = []
    seen_b: list[Mapping[str, bytes]] = []
    a, b = keeper(api, clock, seen_a), keeper(api, clock, seen_b)
    first = await a.ensure()
    assert await b.ensure() == first  # the standby serves the leader's certificate
    clock.now += datetime.timedelta(days=61)
    renewed = await a.ensure()
    assert await b.ensure() == renewed
    assert seen_b == [first, renewed]


async def test_two_replicas_making_it_at_once_agree_on_one() -> None:
    api, clock = FakeApi(), Clock()
    seen_a: list[Mapping[str, bytes]] = []
    seen_b: list[Mapping[str, bytes]] = []
    a, b = keeper(api, clock, seen_a), keeper(api, clock, seen_b)
    real_create = api.create
    raced = False

    async def create_after_the_other(*args: object, **kw: object) -> object:
        # b read no Secret; a creates one before b's create arrives: b's create is refused
        # (AlreadyExists), and b must take a's rather than keep its own.
        nonlocal raced
        if not raced:
            raced = True
            await a.ensure()
        return await real_create(*args, **kw)  # type: ignore[arg-type]

    api.create = create_after_the_other  # type: ignore[method-assign,assignment]
    data_b = await b.ensure()
    assert data_b == stored(api) == seen_a[0]
    assert seen_b == [data_b]
