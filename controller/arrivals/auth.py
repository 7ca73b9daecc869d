"""Who may report an arrival (docs/design.md section 3): the agent shows a projected
service-account token with the audience `gangjob.io/arrival` (useless against the apiserver),
checked once by a TokenReview and then cached; the token is bound to the pod, and the pod it
names must be the one reported for.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from api.constants import ARRIVAL_AUDIENCE

JsonDict = dict[str, Any]

TOKEN_CACHE_SECONDS = 3600.0
"""At most this long, and never past the token's own `exp`: a gang of 5000 re-reviewing every
token in the middle of a restart costs the apiserver 5000 requests (seen at N=5000 with a
10-minute cache). A pod's projected token is rotated by the kubelet well before it expires."""
TOKEN_CACHE_ENTRIES = 100_000
"""Verdicts kept at most (~200 bytes each): only tokens the apiserver authenticated are kept,
and each is bound to a pod, so this is several times the largest fleet of workers."""
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
SA_PREFIX = "system:serviceaccount:"


@dataclass(frozen=True)
class Identity:
    """The pod a token is bound to."""

    namespace: str
    pod: str
    uid: str


class Unauthorized(Exception):
    """The token is not valid for this endpoint."""


class TokenAuthenticator:
    """Checks a token by TokenReview (audience `gangjob.io/arrival`), cached by its hash.

    `review` posts a TokenReview and returns the answer (`controller.k8s` does it)."""

    def __init__(
        self,
        review: Callable[[JsonDict], Awaitable[JsonDict]],
        *,
        audience: str = ARRIVAL_AUDIENCE,
        cache_seconds: float = TOKEN_CACHE_SECONDS,
        concurrency: int = 32,
        max_entries: int = TOKEN_CACHE_ENTRIES,
    ) -> None:
        self._review = review
        self.audience = audience
        self._cache_seconds = cache_seconds
        self._cache: dict[str, tuple[float, Identity]] = {}
        self._max_entries = max_entries
        # A gang of thousands starts together: its first reports queue here, not at the server.
        self._slots = asyncio.Semaphore(concurrency)
        self.reviews = 0

    @property
    def cached(self) -> int:
        """Verdicts held."""
        return len(self._cache)

    def lookup(self, token: str) -> Identity | None:
        """The cached verdict on `token`, if there is a live one (no review)."""
        hit = self._cache.get(hashlib.sha256(token.encode()).hexdigest())
        return hit[1] if hit is not None and hit[0] > time.monotonic() else None

    async def authenticate(self, token: str) -> Identity:
        hit = self.lookup(token)
        if hit is not None:
            return hit
        # A review is due: the digest once more is nothing beside it.
        digest = hashlib.sha256(token.encode()).hexdigest()
        now = time.monotonic()
        async with self._slots:
            self.reviews += 1
            answer = await self._review(
                {
                    "apiVersion": "authentication.k8s.io/v1",
                    "kind": "TokenReview",
                    "spec": {"token": token, "audiences": [self.audience]},
                }
            )
        identity = identity_of(answer, self.audience)
        if len(self._cache) >= self._max_entries:
            self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
            # Still full of live verdicts (tokens minted in bulk): the oldest tenth go (not
            # one, so that the sweep is paid once per many reviews), and their holders pay a
            # review again.
            excess = len(self._cache) - self._max_entries * 9 // 10
            for stale in list(self._cache)[: max(excess, 1)]:
                del self._cache[stale]
        ttl = self._cache_seconds
        expires = token_expiry(token)
        if expires is not None:
            ttl = min(ttl, expires - time.time())
        self._cache[digest] = (now + ttl, identity)
        return identity


def token_expiry(token: str) -> float | None:
    """The `exp` claim (Unix time) of a JWT, read without checking its signature: only to
    bound how long a TokenReview's verdict is kept. None if the token does not say."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except ValueError:
        return None
    exp = payload.get("exp") if isinstance(payload, dict) else None
    return float(exp) if isinstance(exp, int | float) and not isinstance(exp, bool) else None


def identity_of(review: JsonDict, audience: str) -> Identity:
    """The pod a reviewed token is bound to; `Unauthorized` saying why if none."""
    status = review.get("status") or {}
    if not status.get("authenticated"):
        raise Unauthorized(status.get("error") or "token not authenticated")
    if audience not in (status.get("audiences") or [audience]):
        raise Unauthorized(f"token not issued for the audience {audience}")
    user = status.get("user") or {}
    username = user.get("username") or ""
    extra = user.get("extra") or {}
    pod, uid = extra.get(POD_NAME_EXTRA) or [], extra.get(POD_UID_EXTRA) or []
    if not username.startswith(SA_PREFIX) or len(pod) != 1 or len(uid) != 1:
        raise Unauthorized("not a service-account token bound to a pod")
    namespace = username[len(SA_PREFIX) :].split(":", 1)[0]
    return Identity(namespace, pod[0], uid[0])
