"""The typed errors of API calls, and how a response's status code and `Status` body map to them.

`ApiError.retriable` is what the transport's retries and the watch loop go by: 429, 5xx and
failures to reach the apiserver (`TransportError`) are; everything else is the caller's to
handle (`NotFound`, `Conflict`: re-read and decide again; `Gone`: list again).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from controller.k8s.kinds import JsonDict

__all__ = [
    "AlreadyExists",
    "ApiError",
    "Conflict",
    "Forbidden",
    "Gone",
    "Invalid",
    "NotFound",
    "TransportError",
    "error_from_response",
    "error_from_status",
]


class ApiError(Exception):
    """A request the apiserver refused (or that never reached it: `TransportError`)."""

    def __init__(
        self,
        status: int,
        reason: str,
        message: str,
        body: JsonDict | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body
        self.retry_after = retry_after

    @property
    def retriable(self) -> bool:
        return self.status == 429 or self.status >= 500


class TransportError(ApiError):
    """The connection failed or timed out: no HTTP status (client-go reports `<error>`)."""

    def __init__(self, message: str) -> None:
        super().__init__(0, "TransportError", message)

    @property
    def retriable(self) -> bool:
        return True


class NotFound(ApiError):
    pass


class Conflict(ApiError):
    """409 with reason Conflict: a stale resourceVersion or a failed delete precondition.

    Callers requeue: re-read the object and decide again."""


class AlreadyExists(ApiError):
    pass


class Invalid(ApiError):
    """422: the apiserver rejected the object; `message` names the field and the rule."""


class Forbidden(ApiError):
    pass


class Gone(ApiError):
    """410: the resourceVersion asked for is compacted away: list again, then watch."""


def error_from_response(
    status: int, data: bytes, headers: Mapping[str, str] | None = None
) -> ApiError:
    """The typed error for a non-2xx response, read from its `Status` body when it has one."""
    body: JsonDict | None = None
    reason = ""
    message = ""
    try:
        parsed = json.loads(data) if data else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        body = parsed
        reason = str(parsed.get("reason") or "")
        message = str(parsed.get("message") or "")
    else:
        # A proxy or load balancer in front of the apiserver answers with HTML or plain text.
        message = data[:200].decode("utf-8", "replace").strip()
    retry_after = _retry_after((headers or {}).get("Retry-After"), body)
    return _typed_error(status, reason, message, body, retry_after)


def error_from_status(status: JsonDict) -> ApiError:
    """The typed error for a `Status` object that came without an HTTP error: a watch's ERROR
    event ("too old resource version" arrives so, as code 410 on an HTTP 200)."""
    code = status.get("code")
    return _typed_error(
        code if isinstance(code, int) else 500,
        str(status.get("reason") or "Unknown"),
        str(status.get("message") or ""),
        status,
        _retry_after(None, status),
    )


def _typed_error(
    status: int, reason: str, message: str, body: JsonDict | None, retry_after: float | None
) -> ApiError:
    cls: type[ApiError] = ApiError
    if status == 404:
        cls = NotFound
    elif status == 409:
        cls = AlreadyExists if reason == "AlreadyExists" else Conflict
    elif status == 410:
        cls = Gone
    elif status == 422:
        cls = Invalid
    elif status == 403:
        cls = Forbidden
    return cls(status, reason or "Unknown", message, body, retry_after)


def _retry_after(header: str | None, body: JsonDict | None) -> float | None:
    if header:
        try:
            return float(header)
        except ValueError:
            pass
    details = (body or {}).get("details")
    if isinstance(details, dict) and isinstance(details.get("retryAfterSeconds"), int):
        return float(details["retryAfterSeconds"])
    return None
