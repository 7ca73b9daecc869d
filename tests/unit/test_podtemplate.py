"""Unit tests of api.podtemplate: the conversion of Kubernetes' OpenAPI to the structural schema
the CRD embeds, on a small document, and the pin it reads."""

from typing import Any

import pytest

from api import podtemplate
from localcluster import versions

REF = "#/components/schemas/"


def document() -> dict[str, Any]:
    schemas = {
        podtemplate.POD_TEMPLATE_SPEC: {
            "description": "dropped",
            "properties": {
                "metadata": {"allOf": [{"$ref": REF + "Meta"}], "default": {}},
                "spec": {"allOf": [{"$ref": REF + "Spec"}], "default": {}},
            },
            "type": "object",
        },
        "Meta": {"type": "object", "properties": {"managedFields": {"type": "array"}}},
        "Spec": {
            "type": "object",
            "required": ["containers"],
            "properties": {
                "containers": {
                    "type": "array",
                    "items": {"allOf": [{"$ref": REF + "Container"}], "default": {}},
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["name"],
                    "x-kubernetes-patch-merge-key": "name",
                    "x-kubernetes-patch-strategy": "merge",
                },
            },
        },
        "Container": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "default": ""},
                "port": {"allOf": [{"$ref": REF + podtemplate_int_or_string()}]},
                "limits": {
                    "type": "object",
                    "additionalProperties": {"$ref": REF + podtemplate_quantity()},
                },
                "ports": {
                    "type": "array",
                    "items": {"$ref": REF + "Port"},
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["containerPort", "protocol"],
                },
                "size": {"type": "integer", "format": "int32"},
            },
        },
        "Port": {
            "type": "object",
            "required": ["containerPort"],
            "properties": {
                "containerPort": {"type": "integer"},
                "protocol": {"type": "string", "default": "TCP"},
            },
        },
    }
    return {"components": {"schemas": schemas}}


def podtemplate_int_or_string() -> str:
    return "io.k8s.apimachinery.pkg.util.intstr.IntOrString"


def podtemplate_quantity() -> str:
    return "io.k8s.apimachinery.pkg.api.resource.Quantity"


def test_refs_inlined_markers_kept_or_dropped() -> None:
    schema = podtemplate.pod_template_schema(document())
    assert "description" not in schema
    spec = schema["properties"]["spec"]
    containers = spec["properties"]["containers"]
    assert containers["x-kubernetes-list-map-keys"] == ["name"]
    assert "x-kubernetes-patch-strategy" not in containers
    container = containers["items"]
    # Defaults go (they would be written into every stored template) but a list-map key's.
    assert container["properties"]["name"] == {"type": "string"}
    assert container["properties"]["port"] == {"x-kubernetes-int-or-string": True}
    assert container["properties"]["limits"]["additionalProperties"] == {
        "x-kubernetes-int-or-string": True
    }
    assert container["properties"]["size"] == {"type": "integer", "format": "int32"}
    port = container["properties"]["ports"]["items"]
    assert port["properties"]["protocol"] == {"type": "string", "default": "TCP"}
    # The template's metadata is what a worker pod takes from it, not a full ObjectMeta.
    assert set(schema["properties"]["metadata"]["properties"]) == {"labels", "annotations"}


def test_a_list_map_key_neither_required_nor_defaulted_is_an_error() -> None:
    doc = document()
    del doc["components"]["schemas"]["Port"]["properties"]["protocol"]["default"]
    with pytest.raises(ValueError, match="protocol"):
        podtemplate.pod_template_schema(doc)


def test_pinned_to_the_local_cluster_kubernetes() -> None:
    assert podtemplate.KUBERNETES_VERSION == versions.KUBERNETES_VERSION
