"""What worker pods need to reach the API, created on demand in every namespace that runs a
GangJob: the ServiceAccount `gangjob-worker` and its RoleBinding to the ClusterRole of the same
name (manifests/rbac/worker_role.yaml), so that `kubectl apply` of a GangJob just works anywhere.

The agent in each worker reads its GangJob and writes its own pod's annotations; the
ValidatingAdmissionPolicy of manifests/policy narrows the pod patch to the agent's own pod and
its two annotations.
"""

from __future__ import annotations

import logging
from typing import Final, Protocol

from api.constants import WORKER_SERVICE_ACCOUNT
from controller.k8s import AlreadyExists, ApiError, Forbidden, JsonDict, ResourceKind

log = logging.getLogger(__name__)

SERVICE_ACCOUNTS: Final = ResourceKind("", "v1", "serviceaccounts", "ServiceAccount")
ROLE_BINDINGS: Final = ResourceKind(
    "rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"
)

WORKER_ROLE: Final = WORKER_SERVICE_ACCOUNT
"""The ClusterRole the RoleBinding grants (manifests/rbac/worker_role.yaml)."""
WORKER_ROLE_BINDING: Final = WORKER_SERVICE_ACCOUNT
MANAGED_BY: Final = {"app.kubernetes.io/managed-by": "gangjob-controller"}


class Creator(Protocol):
    """The one verb needed of `controller.k8s.Kube`."""

    async def create(
        self,
        kind: ResourceKind,
        obj: JsonDict,
        namespace: str | None = None,
        *,
        request_timeout: float | None = None,
        retry: bool = True,
    ) -> JsonDict: ...


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

    async def ensure(self, kube: Creator, namespace: str) -> None:
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


async def ensure_worker_access(kube: Creator, namespace: str) -> None:
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
