"""What the informer caches keep of each object: controller-runtime's cache transforms.

A `Store` applies its transform to every object it lists or watches, before caching it and
before its handlers see it, so the cache holds only what the controller reads. Every transform
drops `metadata.managedFields` (often half of a small object, read by nobody here). Pods and
Nodes keep exactly what `controller.policy.views` parses (`PodView.from_pod`,
`NodeView.from_node`) plus what the stores' indexes and the manager's event handlers read
(metadata, `spec.nodeName`); the unit tests check on real objects that the views parsed from
the trimmed object equal those parsed from the full one. A field read from a cached Pod or Node
must be kept here first.

Transforms build new dicts rather than delete keys: a dict does not shrink when keys go.
Values of an unexpected type are kept as they are, so that the views judge them as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from controller.k8s.kinds import JsonDict

__all__ = ["Transform", "strip_managed_fields", "trim_node", "trim_pod"]

Transform = Callable[[JsonDict], JsonDict]

# PodView: the restart rules and extended-resource requests of every container, nothing else
# of the spec but the node; of the status, what ContainerView and the pod conditions read.
_CONTAINER_SPEC = ("name", "resources", "restartPolicyRules")
_RESOURCES = ("requests", "limits")
_CONTAINER_STATUS = ("name", "restartCount", "ready", "started", "allocatedResourcesStatus")
_CONTAINER_STATE = ("terminated", "running", "waiting")
_STATE_DETAIL = ("exitCode", "reason", "message", "finishedAt")
_POD_CONDITION = ("type", "status", "reason", "lastTransitionTime")
_POD_STATUS = ("phase", "reason", "message")

# NodeView: taints, unschedulable; condition statuses, resources and declared features.
_NODE_SPEC = ("taints", "unschedulable")
_NODE_STATUS = ("allocatable", "capacity", "declaredFeatures")
_NODE_CONDITION = ("type", "status")


def strip_managed_fields(obj: JsonDict) -> JsonDict:
    """The object without `metadata.managedFields` (controller-runtime's
    TransformStripManagedFields)."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or "managedFields" not in meta:
        return obj
    return {**obj, "metadata": _metadata(meta)}


def trim_pod(pod: JsonDict) -> JsonDict:
    """A Pod as the controller reads it: metadata (without managedFields), `spec.nodeName`,
    `spec.schedulingGroup`, `spec.schedulingGates`, `spec.activeDeadlineSeconds`, the containers'
    resources and restart
    rules, and the status the views parse."""
    out: JsonDict = {k: pod[k] for k in ("apiVersion", "kind") if k in pod}
    meta = pod.get("metadata")
    if meta is not None:
        out["metadata"] = _metadata(meta) if isinstance(meta, Mapping) else meta
    spec = pod.get("spec")
    if spec is not None:
        out["spec"] = _pod_spec(spec) if isinstance(spec, Mapping) else spec
    status = pod.get("status")
    if status is not None:
        out["status"] = _pod_status(status) if isinstance(status, Mapping) else status
    return out


def trim_node(node: JsonDict) -> JsonDict:
    """A Node as the controller reads it: metadata (without managedFields), taints and
    unschedulable, condition statuses, allocatable/capacity and declared features (not its
    image list, addresses or nodeInfo)."""
    out: JsonDict = {k: node[k] for k in ("apiVersion", "kind") if k in node}
    meta = node.get("metadata")
    if meta is not None:
        out["metadata"] = _metadata(meta) if isinstance(meta, Mapping) else meta
    spec = node.get("spec")
    if spec is not None:
        out["spec"] = _pick(spec, _NODE_SPEC) if isinstance(spec, Mapping) else spec
    status = node.get("status")
    if isinstance(status, Mapping):
        trimmed = _pick(status, _NODE_STATUS)
        if "conditions" in status:
            trimmed["conditions"] = _each(status["conditions"], _NODE_CONDITION)
        out["status"] = trimmed
    elif status is not None:
        out["status"] = status
    return out


def _metadata(meta: Mapping[str, Any]) -> JsonDict:
    return {k: v for k, v in meta.items() if k != "managedFields"}


def _pick(obj: Mapping[str, Any], keys: Iterable[str]) -> JsonDict:
    return {k: obj[k] for k in keys if k in obj}


def _each(
    value: Any, keys: Iterable[str], trim: Callable[[Mapping[str, Any]], JsonDict] | None = None
) -> Any:
    """Each mapping of a list trimmed to `keys` (or by `trim`); anything else as it is."""
    if not isinstance(value, list):
        return value
    keys = tuple(keys)
    return [
        (trim(item) if trim is not None else _pick(item, keys))
        if isinstance(item, Mapping)
        else item
        for item in value
    ]


def _container_spec(container: Mapping[str, Any]) -> JsonDict:
    out = _pick(container, _CONTAINER_SPEC)
    resources = out.get("resources")
    if isinstance(resources, Mapping):
        out["resources"] = _pick(resources, _RESOURCES)
    return out


def _pod_spec(spec: Mapping[str, Any]) -> JsonDict:
    out = _pick(spec, ("nodeName", "schedulingGroup", "schedulingGates", "activeDeadlineSeconds"))
    for key in ("containers", "initContainers"):
        if key in spec:
            out[key] = _each(spec[key], (), _container_spec)
    return out


def _state(state: Mapping[str, Any]) -> JsonDict:
    return {
        name: _pick(detail, _STATE_DETAIL) if isinstance(detail, Mapping) else detail
        for name, detail in state.items()
        if name in _CONTAINER_STATE
    }


def _container_status(status: Mapping[str, Any]) -> JsonDict:
    out = _pick(status, _CONTAINER_STATUS)
    for key in ("state", "lastState"):
        value = status.get(key)
        if isinstance(value, Mapping):
            out[key] = _state(value)
        elif value is not None:
            out[key] = value
    return out


def _pod_status(status: Mapping[str, Any]) -> JsonDict:
    out = _pick(status, _POD_STATUS)
    if "conditions" in status:
        out["conditions"] = _each(status["conditions"], _POD_CONDITION)
    for key in ("containerStatuses", "initContainerStatuses"):
        if key in status:
            out[key] = _each(status[key], (), _container_status)
    return out
