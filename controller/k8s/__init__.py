"""The controller's only door to the Kubernetes API; the only package importing kubernetes_asyncio.

kinds (where each kind lives), errors (typed refusals), transport (session, timeouts, retries,
metrics), watch (paged lists, resumable watches), client (`Kube`, the verbs), verbs (`ObjectApi`,
the verbs on one object that a test fake stands in for); store (the informer cache) and leader
(Lease election) are built on them. The rest of the controller imports the names below from here.
"""

from controller.k8s.client import Kube
from controller.k8s.errors import (
    AlreadyExists,
    ApiError,
    Conflict,
    Forbidden,
    Gone,
    Invalid,
    NotFound,
    TransportError,
    error_from_response,
)
from controller.k8s.kinds import (
    CLUSTER_ROLES,
    CONFIGMAPS,
    CORE_EVENTS,
    CRDS,
    GANGJOBS,
    LEASES,
    NAMESPACES,
    NODES,
    PODGROUPS,
    PODS,
    SECRETS,
    SERVICES,
    SUBJECT_ACCESS_REVIEWS,
    TOKENREVIEWS,
    WORKLOADS,
    JsonDict,
    ResourceKind,
)
from controller.k8s.transport import RetryPolicy
from controller.k8s.verbs import ObjectApi
from controller.k8s.watch import ObjectList, WatchEvent, selector

__all__ = [
    "CLUSTER_ROLES",
    "CONFIGMAPS",
    "CORE_EVENTS",
    "CRDS",
    "GANGJOBS",
    "LEASES",
    "NAMESPACES",
    "NODES",
    "PODGROUPS",
    "PODS",
    "SECRETS",
    "SERVICES",
    "SUBJECT_ACCESS_REVIEWS",
    "TOKENREVIEWS",
    "WORKLOADS",
    "AlreadyExists",
    "ApiError",
    "Conflict",
    "Forbidden",
    "Gone",
    "Invalid",
    "JsonDict",
    "Kube",
    "NotFound",
    "ObjectApi",
    "ObjectList",
    "ResourceKind",
    "RetryPolicy",
    "TransportError",
    "WatchEvent",
    "error_from_response",
    "selector",
]
