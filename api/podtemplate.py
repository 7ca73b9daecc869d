"""The core/v1 PodTemplateSpec schema of the pinned Kubernetes, as a structural CRD schema: what
`spec.template` and `spec.roles[].template` are validated against, so that `kubectl apply`
names a misspelt field (`resource:` for `resources:`) instead of the apiserver dropping it.

It is generated, never written by hand: `pod_template_schema` converts the schema in Kubernetes'
own OpenAPI v3 document (`api/openapi-spec/v3/api__v1_openapi.json` of the k8s.io/kubernetes
module at `KUBERNETES_VERSION`, fetched through the Go module proxy as localcluster/build.py
fetches it) the way controller-gen embeds a PodTemplateSpec: `$ref`s inlined, `oneOf`
int-or-string and quantity fields as `x-kubernetes-int-or-string`, strategic-merge and union
markers dropped, list-map markers kept. Descriptions are dropped too (`kubectl explain pod.spec`
has them; two copies would double the CRD), and so are defaults, but for list-map keys, which a
structural schema requires (`ports[].protocol`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any, Final

KUBERNETES_VERSION: Final = "v1.36.2"
"""The Kubernetes whose PodTemplateSpec the CRD embeds: the local cluster's
(localcluster/versions.py; a unit test keeps the two equal)."""
MODULE: Final = f"k8s.io/kubernetes@{KUBERNETES_VERSION}"
OPENAPI_FILE: Final = "api/openapi-spec/v3/api__v1_openapi.json"
POD_TEMPLATE_SPEC: Final = "io.k8s.api.core.v1.PodTemplateSpec"
_REF_PREFIX: Final = "#/components/schemas/"
_INT_OR_STRING: Final = frozenset(
    {
        "io.k8s.apimachinery.pkg.util.intstr.IntOrString",
        "io.k8s.apimachinery.pkg.api.resource.Quantity",
    }
)
# Formats the apiserver knows; others (`int-or-string`) say nothing a CRD can use.
_FORMATS: Final = frozenset({"int32", "int64", "byte", "date-time", "double"})
_KEPT: Final = (
    "type",
    "format",
    "enum",
    "required",
    "properties",
    "additionalProperties",
    "items",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
)

# The template's metadata: what a worker pod takes from it. A full ObjectMeta would accept
# fields (name, ownerReferences, managedFields) the controller sets itself.
_METADATA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "labels": {
            "description": "Labels of every worker pod.",
            "type": "object",
            "additionalProperties": {"type": "string"},
        },
        "annotations": {
            "description": "Annotations of every worker pod.",
            "type": "object",
            "additionalProperties": {"type": "string"},
        },
    },
}


class OpenAPIUnavailable(RuntimeError):
    """Kubernetes' OpenAPI document cannot be read (no Go, no module proxy)."""


@cache
def kubernetes_openapi() -> dict[str, Any]:
    """The core/v1 OpenAPI v3 document of `KUBERNETES_VERSION`, from the Go module cache
    (downloaded through the module proxy on first use)."""
    go = shutil.which("go")
    if go is None:
        raise OpenAPIUnavailable(
            f"`go` is not on PATH: it fetches {MODULE}, whose OpenAPI the CRD embeds"
        )
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}
    # Outside any module, so that no go.mod around the checkout takes part.
    with tempfile.TemporaryDirectory() as empty:
        out = subprocess.run(
            [go, "mod", "download", "-json", MODULE],
            env=env,
            cwd=empty,
            capture_output=True,
            text=True,
        )
    if out.returncode != 0:
        raise OpenAPIUnavailable(f"cannot download {MODULE}: {out.stdout}{out.stderr}")
    path = Path(json.loads(out.stdout)["Dir"]) / OPENAPI_FILE
    document: dict[str, Any] = json.loads(path.read_text())
    return document


def pod_template_schema(document: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The structural schema of a PodTemplateSpec, from `document` (default: the pinned
    Kubernetes' OpenAPI)."""
    schemas = (document or kubernetes_openapi())["components"]["schemas"]
    root = _convert(schemas[POD_TEMPLATE_SPEC], schemas, ())
    root["properties"]["metadata"] = json.loads(json.dumps(_METADATA))
    return root


def _convert(
    node: Mapping[str, Any], schemas: Mapping[str, Any], expanding: tuple[str, ...]
) -> dict[str, Any]:
    all_of = node.get("allOf")
    ref = node.get("$ref") or (all_of[0].get("$ref") if all_of and len(all_of) == 1 else None)
    if ref is not None:
        name = ref.removeprefix(_REF_PREFIX)
        if name in _INT_OR_STRING:
            return {"x-kubernetes-int-or-string": True}
        if name in expanding:
            raise ValueError(f"recursive type {name} cannot be inlined")
        return _convert(schemas[name], schemas, (*expanding, name))
    if "oneOf" in node or "anyOf" in node:
        raise ValueError(f"a union has no structural schema: {sorted(node)}")
    out: dict[str, Any] = {key: node[key] for key in _KEPT if key in node}
    if out.get("format") not in _FORMATS:
        out.pop("format", None)
    if "properties" in out:
        out["properties"] = {
            name: _convert(prop, schemas, expanding) for name, prop in out["properties"].items()
        }
    if isinstance(out.get("additionalProperties"), Mapping):
        out["additionalProperties"] = _convert(out["additionalProperties"], schemas, expanding)
    if "items" in out:
        out["items"] = _convert(out["items"], schemas, expanding)
        keys = out.get("x-kubernetes-list-map-keys") or []
        item = out["items"]
        for key in keys:
            # A list-map key must be required or defaulted; the API's default is the one
            # the apiserver applies to pods anyway.
            if key not in item.get("required", []):
                default = _list_map_default(node["items"], key, schemas)
                if default is None:
                    raise ValueError(f"list-map key {key} is neither required nor defaulted")
                item["properties"][key]["default"] = default
    if "type" not in out and "properties" in out:
        out["type"] = "object"
    return out


def _list_map_default(items: Mapping[str, Any], key: str, schemas: Mapping[str, Any]) -> Any:
    """The API's default of property `key` of the list items `items` (a `$ref` or inline)."""
    all_of = items.get("allOf")
    ref = items.get("$ref") or (all_of[0].get("$ref") if all_of else None)
    target = schemas[ref.removeprefix(_REF_PREFIX)] if ref else items
    return (target.get("properties") or {}).get(key, {}).get("default")
