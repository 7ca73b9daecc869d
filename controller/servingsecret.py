"""The arrival endpoint's own certificate, kept in a Secret of the controller's namespace so
that every replica (the leader and its standbys) serves the same one and the CA the worker pods
were given stays the CA: `ServingSecret` reads it, renews what `controller.runtime.certs.renew`
says is due, and writes it back conditional on what it read, so that two replicas renewing at
once agree on one result."""

from __future__ import annotations

import asyncio
import base64
import datetime
import logging
from collections.abc import Callable, Mapping, Sequence

from controller.k8s import SECRETS, AlreadyExists, ApiError, Conflict, JsonDict, NotFound, ObjectApi
from controller.runtime import certs

__all__ = ["DEFAULT_SECRET", "FOLLOW_SECONDS", "ServingSecret"]

log = logging.getLogger(__name__)

DEFAULT_SECRET = "gangjob-arrival-tls"
FOLLOW_SECONDS = 60.0
"""How often every replica reads the Secret: a renewal (by itself or another replica) is served
within this long. One GET a minute per replica."""
_RETRY_SECONDS = (0.5, 1.0, 2.0, 5.0)


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _decode(secret: JsonDict) -> dict[str, bytes]:
    data = secret.get("data") or {}
    out = {}
    for key, value in data.items():
        try:
            out[key] = base64.b64decode(value)
        except (ValueError, TypeError):
            continue
    return out


class ServingSecret:
    """The Secret `namespace/name`, holding the CA (`ca.crt`, `ca.key`) and the serving
    certificate for `names` (`tls.crt`, `tls.key`). `on_change(data)` is called with what it
    holds the first time and whenever that changes."""

    def __init__(
        self,
        api: ObjectApi,
        namespace: str,
        name: str,
        names: Sequence[str],
        on_change: Callable[[Mapping[str, bytes]], None],
        *,
        lifetimes: certs.Lifetimes = certs.DEFAULT_LIFETIMES,
        clock: Callable[[], datetime.datetime] = _utcnow,
    ) -> None:
        self.api, self.namespace, self.name = api, namespace, name
        self.names = list(names)
        self.on_change = on_change
        self.lifetimes = lifetimes
        self.clock = clock
        self.held: dict[str, bytes] | None = None

    async def ensure(self) -> dict[str, bytes]:
        """Reads the Secret, writes it renewed if anything is due, and returns what it holds.
        A write that lost to another replica's (AlreadyExists, Conflict) reads again."""
        while True:
            try:
                secret: JsonDict | None = await self.api.get(SECRETS, self.name, self.namespace)
            except NotFound:
                secret = None
            held = _decode(secret) if secret is not None else None
            data = certs.renew(held, self.names, self.clock(), self.lifetimes)
            if data is None:
                assert held is not None
                break
            body = self._body(data, secret)
            try:
                if secret is None:
                    await self.api.create(SECRETS, body, self.namespace)
                else:
                    await self.api.replace(SECRETS, self.name, body, self.namespace)
            except (AlreadyExists, Conflict):
                continue  # another replica wrote first: take what it wrote
            log.info(
                "arrival certificate for %s written to Secret %s/%s%s",
                ", ".join(self.names),
                self.namespace,
                self.name,
                " with a new CA" if (held or {}).get(certs.CA_CERT) != data[certs.CA_CERT] else "",
            )
            held = data
            break
        if held != self.held:
            self.held = held
            self.on_change(held)
        return held

    def _body(self, data: Mapping[str, bytes], secret: JsonDict | None) -> JsonDict:
        """The Secret holding `data`: the one read, its metadata (the installer's labels and
        annotations, the resourceVersion the write is conditional on) and type kept; else a
        new Opaque one (the chart makes it empty, and an empty `kubernetes.io/tls` is
        refused)."""
        encoded = {k: base64.b64encode(v).decode() for k, v in sorted(data.items())}
        if secret is not None:
            return {**secret, "data": {**(secret.get("data") or {}), **encoded}}
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "labels": {"app.kubernetes.io/name": "gangjob-controller"},
            },
            "type": "Opaque",
            "data": encoded,
        }

    async def start(self) -> dict[str, bytes]:
        """`ensure` until it succeeds (the controller serves nothing without a certificate)."""
        for attempt in range(1_000_000):
            try:
                return await self.ensure()
            except ApiError as e:
                wait = _RETRY_SECONDS[min(attempt, len(_RETRY_SECONDS) - 1)]
                log.warning(
                    "cannot keep the arrival certificate in Secret %s/%s (%s); again in %gs",
                    self.namespace,
                    self.name,
                    e,
                    wait,
                )
                await asyncio.sleep(wait)
        raise AssertionError("unreachable")

    async def follow(self, every: float = FOLLOW_SECONDS) -> None:
        """`ensure` every `every` seconds until cancelled; a failure waits for the next one
        (the certificate served is valid for a third of its life after its renewal is due)."""
        while True:
            await asyncio.sleep(every)
            try:
                await self.ensure()
            except ApiError as e:
                log.warning("arrival certificate not checked (%s): again in %gs", e, every)
