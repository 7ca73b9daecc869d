"""What worker pods need to reach the API, created on demand in every namespace that runs a
GangJob: the ServiceAccount `gangjob-worker` and its RoleBinding to the ClusterRole of the same
name (manifests/rbac/worker_role.yaml), so that `kubectl apply` of a GangJob just works anywhere.

The agent in each worker reads its GangJob and writes its own pod's annotations; the
ValidatingAdmissionPolicy of manifests/policy narrows the pod patch to the agent's own pod and
its two annotations.

Whether the agents may really do so is checked too, since the ClusterRole is installed apart
from the controller: at start-up (`check_worker_role`, a log line) and per namespace and
ServiceAccount by SubjectAccessReview (`AccessReview`), which feeds the `Stuck` condition
(controller/policy/stuck.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from api.constants import WORKER_ROLE_FILE, WORKER_SERVICE_ACCOUNT
from controller.k8s import (
    CLUSTER_ROLES,
    SUBJECT_ACCESS_REVIEWS,
    AlreadyExists,
    ApiError,
    Forbidden,
    JsonDict,
    NotFound,
    ObjectApi,
    ResourceKind,
)

log = logging.getLogger(__name__)

SERVICE_ACCOUNTS: Final = ResourceKind("", "v1", "serviceaccounts", "ServiceAccount")
ROLE_BINDINGS: Final = ResourceKind(
    "rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"
)

WORKER_ROLE: Final = WORKER_SERVICE_ACCOUNT
"""The ClusterRole the RoleBinding grants (manifests/rbac/worker_role.yaml)."""
WORKER_ROLE_BINDING: Final = WORKER_SERVICE_ACCOUNT
MANAGED_BY: Final = {"app.kubernetes.io/managed-by": "gangjob-controller"}

WORKER_PERMISSIONS: Final = (
    ("get", "", "pods"),
    ("patch", "", "pods"),
    ("get", "gangjob.io", "gangjobs"),
    ("list", "gangjob.io", "gangjobs"),
    ("watch", "gangjob.io", "gangjobs"),
)
"""(verb, API group, resource): what a worker's agent does with the API, as the ClusterRole
`gangjob-worker` grants it (manifests/rbac/worker_role.yaml)."""


def service_account(namespace: str) -> JsonDict:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": WORKER_SERVICE_ACCOUNT, "namespace": namespace, "labels": MANAGED_BY},
    }


def role_binding(namespace: str) -> JsonDict:
    # A RoleBinding to a ClusterRole: the role's rules hold in this namespace only. Creating it
    # needs `bind` on that ClusterRole (RBAC escalation prevention), which is all the
    # controller's own role grants beyond `create`.
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": WORKER_ROLE_BINDING, "namespace": namespace, "labels": MANAGED_BY},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": WORKER_ROLE,
        },
        "subjects": [
            {"kind": "ServiceAccount", "name": WORKER_SERVICE_ACCOUNT, "namespace": namespace}
        ],
    }


class WorkerAccess:
    """Creates the worker ServiceAccount and RoleBinding of a namespace once per process.

    Create-if-missing, never update: an existing object of that name is left as it is (an
    administrator may have shaped it). A namespace is remembered as done only once both exist,
    so a failed attempt is retried by the next reconcile. Memory is per process; a new leader
    does its first pass per namespace again, at the cost of two AlreadyExists answers.
    """

    def __init__(self) -> None:
        self._done: set[str] = set()

    def done(self, namespace: str) -> bool:
        return namespace in self._done

    async def ensure(self, kube: ObjectApi, namespace: str) -> None:
        """Raises the API's error (e.g. `Forbidden` in a namespace being deleted) if either
        object can be neither created nor found to exist."""
        if namespace in self._done:
            return
        for kind, obj in (
            (SERVICE_ACCOUNTS, service_account(namespace)),
            (ROLE_BINDINGS, role_binding(namespace)),
        ):
            try:
                await kube.create(kind, obj, namespace)
                log.info("created %s %s/%s", kind.kind, namespace, obj["metadata"]["name"])
            except AlreadyExists:
                pass
        self._done.add(namespace)

    def forget(self, namespace: str) -> None:
        """Check the namespace again on the next `ensure`: call it when a worker pod's creation
        is refused because its ServiceAccount is missing (deleted by hand, or the namespace was
        deleted and created again under the same name)."""
        self._done.discard(namespace)


_PROCESS_WIDE: Final = WorkerAccess()


async def ensure_worker_access(kube: ObjectApi, namespace: str) -> None:
    """Make sure `namespace` has the worker ServiceAccount and RoleBinding; free after the
    first success per namespace in this process."""
    await _PROCESS_WIDE.ensure(kube, namespace)


def forget_worker_access(namespace: str) -> None:
    """See `WorkerAccess.forget`."""
    _PROCESS_WIDE.forget(namespace)


def missing_service_account(error: ApiError) -> bool:
    """Whether a pod creation was refused because its ServiceAccount does not exist (the
    apiserver's ServiceAccount admission answers 403 "error looking up service account
    <ns>/<name>: serviceaccount \"<name>\" not found"): then `forget_worker_access`."""
    return (
        isinstance(error, Forbidden)
        and "error looking up service account" in error.message
        and "not found" in error.message
    )


def permission_text(permission: tuple[str, str, str]) -> str:
    verb, _, resource = permission
    return f"{verb} {resource}"


def access_review(
    namespace: str, service_account: str, permission: tuple[str, str, str]
) -> JsonDict:
    """A SubjectAccessReview: may this namespace's ServiceAccount, as its pods' tokens
    authenticate it, do this in the namespace?"""
    verb, group, resource = permission
    return {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": f"system:serviceaccount:{namespace}:{service_account}",
            "groups": [
                "system:serviceaccounts",
                f"system:serviceaccounts:{namespace}",
                "system:authenticated",
            ],
            "resourceAttributes": {
                "namespace": namespace,
                "verb": verb,
                "group": group,
                "resource": resource,
            },
        },
    }


class AccessReview:
    """What the agents of a namespace's ServiceAccount may not do, by SubjectAccessReview,
    looked up at most once per `ttl` per (namespace, ServiceAccount) and never failing a pass:
    an error leaves the last answer (unknown: nothing denied).

    The controller's own ServiceAccount and RoleBinding are checked only once `access` made
    them in this process (before, the review would deny what the first pass is about to
    grant). A denial for them makes them again first (someone deleted the RoleBinding): only
    what that does not cure is reported.

    An answer past its `ttl` still serves while the next is asked in the background, and
    `on_change(namespace)` is told when that one differs: a pass (a failure's, the one that
    opens a barrier) must not wait a round trip to an apiserver that, in a large in-place
    restart, is busy with every kubelet's status writes (0.29 s at N=1000 on the sim).
    """

    def __init__(
        self,
        kube: ObjectApi,
        *,
        ttl: float = 30.0,
        access: WorkerAccess | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[str], None] | None = None,
    ) -> None:
        self._kube = kube
        self._ttl = ttl
        self._on_change = on_change
        self._access = access if access is not None else _PROCESS_WIDE
        self._clock = clock
        self._answers: dict[tuple[str, str], tuple[float, tuple[str, ...]]] = {}
        self._inflight: dict[tuple[str, str], asyncio.Task[tuple[str, ...]]] = {}
        self._disabled = False

    async def denied(self, namespace: str, service_account: str) -> tuple[str, ...]:
        """What the agents may not do (`get pods`, ...), empty if all is allowed or unknown."""
        if self._disabled:
            return ()
        if service_account == WORKER_SERVICE_ACCOUNT and not self._access.done(namespace):
            return ()
        key = (namespace, service_account)
        hit = self._answers.get(key)
        if hit is not None and self._clock() < hit[0] + self._ttl:
            return hit[1]
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.create_task(self._review(namespace, service_account))
            self._inflight[key] = task
            task.add_done_callback(lambda done: self._reviewed(key, done))
        if hit is not None:
            return hit[1]  # stale, while the next answer is asked
        return await asyncio.shield(task)

    def _reviewed(self, key: tuple[str, str], task: asyncio.Task[tuple[str, ...]]) -> None:
        self._inflight.pop(key, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("SubjectAccessReview of %s/%s failed", *key, exc_info=task.exception())

    async def _review(self, namespace: str, service_account: str) -> tuple[str, ...]:
        key = (namespace, service_account)
        before = self._answers.get(key, (0.0, ()))[1]
        try:
            denied = await self._ask(namespace, service_account)
            if denied and service_account == WORKER_SERVICE_ACCOUNT:
                self._access.forget(namespace)
                try:
                    await self._access.ensure(self._kube, namespace)
                except ApiError as e:
                    log.info("cannot make worker access in %s again: %s", namespace, e)
                denied = await self._ask(namespace, service_account)
        except Forbidden as e:
            self._disabled = True
            log.warning(
                "cannot check what worker agents may do (SubjectAccessReview refused: %s): "
                "a missing ClusterRole %s will not be reported on the GangJobs",
                e,
                WORKER_ROLE,
            )
            return ()
        except ApiError as e:
            log.info("SubjectAccessReview for %s/%s failed: %s", namespace, service_account, e)
            denied = before
        if denied and denied != before:
            log.warning(
                "worker agents in namespace %s run as ServiceAccount %s, which may not %s: "
                "their GangJobs are stuck. Fix: install the ClusterRole %s (%s, `make "
                "install`) and bind it there",
                namespace,
                service_account,
                ", ".join(denied),
                WORKER_ROLE,
                WORKER_ROLE_FILE,
            )
        elif before and not denied:
            log.info("worker agents in %s/%s may do their part again", namespace, service_account)
        known = key in self._answers
        self._answers[key] = (self._clock(), denied)
        if known and denied != before and self._on_change is not None:
            self._on_change(namespace)
        return denied

    async def _ask(self, namespace: str, service_account: str) -> tuple[str, ...]:
        answers = await asyncio.gather(
            *(
                self._kube.create(
                    SUBJECT_ACCESS_REVIEWS, access_review(namespace, service_account, permission)
                )
                for permission in WORKER_PERMISSIONS
            )
        )
        return tuple(
            permission_text(permission)
            for permission, answer in zip(WORKER_PERMISSIONS, answers, strict=True)
            if (answer.get("status") or {}).get("allowed") is not True
        )


def missing_permissions(rules: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """What of `WORKER_PERMISSIONS` a ClusterRole's rules do not grant."""

    def grants(rule: Mapping[str, Any], permission: tuple[str, str, str]) -> bool:
        verb, group, resource = permission
        return (
            not rule.get("resourceNames")
            and any(g in (group, "*") for g in rule.get("apiGroups") or ())
            and any(r in (resource, "*") for r in rule.get("resources") or ())
            and any(v in (verb, "*") for v in rule.get("verbs") or ())
        )

    return tuple(
        permission_text(permission)
        for permission in WORKER_PERMISSIONS
        if not any(grants(rule, permission) for rule in rules)
    )


async def check_worker_role(kube: ObjectApi) -> tuple[str, ...] | None:
    """At start-up: logs an error if the ClusterRole `gangjob-worker` is missing or grants
    less than the agents need. Returns what is missing (empty: nothing), None if unknown."""
    try:
        role = await kube.get(CLUSTER_ROLES, WORKER_ROLE)
    except NotFound:
        log.error(
            "ClusterRole %s not found: every worker agent will get 403 reading its pod and "
            "GangJob, and every GangJob will be Stuck (WorkerRBACMissing). Fix: kubectl apply "
            "-f %s (`make install` does it)",
            WORKER_ROLE,
            WORKER_ROLE_FILE,
        )
        return tuple(permission_text(p) for p in WORKER_PERMISSIONS)
    except ApiError as e:
        log.info("cannot read ClusterRole %s (%s): not checked", WORKER_ROLE, e)
        return None
    missing = missing_permissions(role.get("rules") or [])
    if missing:
        log.error(
            "ClusterRole %s does not grant %s: worker agents will get 403 and their GangJobs "
            "will be Stuck (WorkerRBACMissing). Fix: kubectl apply -f %s",
            WORKER_ROLE,
            ", ".join(missing),
            WORKER_ROLE_FILE,
        )
    else:
        log.info("ClusterRole %s grants what worker agents need", WORKER_ROLE)
    return missing
