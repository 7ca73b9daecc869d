"""Where each kind lives in the API (`ResourceKind`) and the kinds the controller uses.

Objects travel as raw JSON dicts (`JsonDict`): the generated model classes cost several times
more per object, and the hot path handles thousands of pods.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "CORE_EVENTS",
    "CRDS",
    "GANGJOBS",
    "LEASES",
    "NAMESPACES",
    "NODES",
    "PODGROUPS",
    "PODS",
    "SERVICES",
    "TOKENREVIEWS",
    "WORKLOADS",
    "JsonDict",
    "ResourceKind",
]

JsonDict = dict[str, Any]


@dataclass(frozen=True)
class ResourceKind:
    """Where a kind lives in the API: enough to build its URLs, nothing more."""

    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def resource(self) -> str:
        """The metrics label: `pods`, `leases.coordination.k8s.io`, ..."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced:
            if namespace is None and name is not None:
                raise ValueError(f"{self.resource} is namespaced: a namespace is required")
            if namespace is not None:
                base += f"/namespaces/{namespace}"
        elif namespace is not None:
            raise ValueError(f"{self.resource} is cluster-scoped: no namespace")
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{name}"
            if subresource is not None:
                base += f"/{subresource}"
        return base


PODS = ResourceKind("", "v1", "pods", "Pod")
SERVICES = ResourceKind("", "v1", "services", "Service")
CONFIGMAPS = ResourceKind("", "v1", "configmaps", "ConfigMap")
SECRETS = ResourceKind("", "v1", "secrets", "Secret")
NODES = ResourceKind("", "v1", "nodes", "Node", namespaced=False)
NAMESPACES = ResourceKind("", "v1", "namespaces", "Namespace", namespaced=False)
CORE_EVENTS = ResourceKind("", "v1", "events", "Event")
LEASES = ResourceKind("coordination.k8s.io", "v1", "leases", "Lease")
GANGJOBS = ResourceKind("gangjob.io", "v1alpha1", "gangjobs", "GangJob")
CRDS = ResourceKind(
    "apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False
)
TOKENREVIEWS = ResourceKind("authentication.k8s.io", "v1", "tokenreviews", "TokenReview", False)
SUBJECT_ACCESS_REVIEWS = ResourceKind(
    "authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview", False
)
CLUSTER_ROLES = ResourceKind(
    "rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False
)
# KEP-4671 gang scheduling, alpha in 1.36 (served with the GenericWorkload feature gate and the
# runtime config scheduling.k8s.io/v1alpha2=true): a Workload holds PodGroup templates, a
# PodGroup (made from one) is what pods name in `spec.schedulingGroup.podGroupName`.
WORKLOADS = ResourceKind("scheduling.k8s.io", "v1alpha2", "workloads", "Workload")
PODGROUPS = ResourceKind("scheduling.k8s.io", "v1alpha2", "podgroups", "PodGroup")
