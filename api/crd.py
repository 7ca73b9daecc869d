"""The GangJob CustomResourceDefinition, generated from the models in `api.v1alpha1`: a converter
from pydantic's JSON schema to a Kubernetes structural schema, the CRD built with it, and the CLI
that writes or checks `manifests/crd/` (`python -m api.crd [--check]`).
"""

import argparse
import copy
import difflib
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import yaml

from api.constants import (
    CATEGORY,
    CRD_NAME,
    GROUP,
    KIND,
    LIST_KIND,
    PLURAL,
    SHORT_NAME,
    SINGULAR,
    VERSION,
)
from api.podtemplate import pod_template_schema
from api.v1alpha1 import GangJobSpec, GangJobStatus


class SchemaError(ValueError):
    """The JSON schema uses something a Kubernetes structural schema cannot say."""


# The keywords of apiextensions.k8s.io/v1 JSONSchemaProps we emit. Anything else pydantic
# produces is either dropped on purpose below or an error, so that a new model feature cannot
# slip a keyword into the CRD that the apiserver would reject or silently ignore.
_KEY_ORDER: Final = (
    "description",
    "type",
    "format",
    "enum",
    "default",
    "minimum",
    "exclusiveMinimum",
    "maximum",
    "exclusiveMaximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "nullable",
    "required",
    "properties",
    "additionalProperties",
    "items",
    "x-kubernetes-embedded-resource",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-int-or-string",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
    "x-kubernetes-validations",
)
_ALLOWED_KEYS: Final = frozenset(_KEY_ORDER)
_VALIDATION_KEY_ORDER: Final = (
    "rule",
    "message",
    "messageExpression",
    "reason",
    "fieldPath",
    "optionalOldSelf",
)
_DEFS_PREFIX: Final = "#/$defs/"


def structural_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Convert a pydantic (JSON Schema 2020-12) schema to a Kubernetes structural schema.

    `$ref`s are inlined (the field's own description wins over its type's), `Optional[X]`
    becomes X left out of `required`, `const` a one-value `enum`, numeric `exclusiveMinimum`
    the OpenAPI v3.0 boolean form; `title` and `additionalProperties: false` are dropped.
    Raises SchemaError for what has no structural equivalent (unions, recursion, unknown
    keywords, a node without a type).
    """
    defs: Mapping[str, Any] = schema.get("$defs", {})
    # Each inlined copy of a type is its own object, so that editing one changes no other.
    return copy.deepcopy(_convert(schema, defs, path="", expanding=()))


def _convert(
    node: Mapping[str, Any], defs: Mapping[str, Any], path: str, expanding: tuple[str, ...]
) -> dict[str, Any]:
    node = {key: value for key, value in node.items() if key != "$defs"}
    where = path or "<root>"

    if "$ref" in node:
        ref = node.pop("$ref")
        name = ref.removeprefix(_DEFS_PREFIX)
        if not ref.startswith(_DEFS_PREFIX) or name not in defs:
            raise SchemaError(f"{where}: unresolvable $ref {ref!r}")
        if name in expanding:
            raise SchemaError(f"{where}: recursive type {name} cannot be inlined")
        return _convert({**defs[name], **node}, defs, path, (*expanding, name))

    if "allOf" in node:
        parts = node.pop("allOf")
        if len(parts) != 1:
            raise SchemaError(f"{where}: allOf with {len(parts)} schemas")
        return _convert({**parts[0], **node}, defs, path, expanding)

    if "anyOf" in node:
        branches = [b for b in node.pop("anyOf") if b != {"type": "null"}]
        if len(branches) != 1:
            raise SchemaError(f"{where}: a union has no structural schema")
        # Optional[X]: not required and no default is enough; the apiserver prunes a null.
        return _convert({**branches[0], **node}, defs, path, expanding)

    for keyword in ("oneOf", "not"):
        if keyword in node:
            raise SchemaError(f"{where}: {keyword} is not supported")

    node.pop("title", None)
    if "default" in node and node["default"] is None:
        del node["default"]
    if "const" in node:
        node["enum"] = [node.pop("const")]
    for bound, plain in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(node.get(bound), int | float) and not isinstance(node[bound], bool):
            node[plain] = node.pop(bound)
            node[bound] = True
    if node.get("uniqueItems") is True:
        raise SchemaError(f"{where}: uniqueItems; use x-kubernetes-list-type: set instead")

    additional = node.pop("additionalProperties", False)
    if additional is True:
        node["x-kubernetes-preserve-unknown-fields"] = True
    elif isinstance(additional, Mapping):
        node["additionalProperties"] = _convert(
            additional, defs, f"{path}.additionalProperties", expanding
        )

    if "properties" in node:
        node["properties"] = {
            name: _convert(prop, defs, f"{path}.{name}", expanding)
            for name, prop in node["properties"].items()
        }
    if "items" in node:
        node["items"] = _convert(node["items"], defs, f"{path}[]", expanding)
    if not node.get("required", True):
        del node["required"]

    unknown = set(node) - _ALLOWED_KEYS
    if unknown:
        raise SchemaError(f"{where}: keywords not allowed in a CRD schema: {sorted(unknown)}")
    if "type" not in node and not (
        node.get("x-kubernetes-preserve-unknown-fields") or node.get("x-kubernetes-int-or-string")
    ):
        raise SchemaError(f"{where}: every node of a structural schema needs a type")
    return _ordered(node)


def _ordered(node: dict[str, Any]) -> dict[str, Any]:
    # One fixed key order, whatever order pydantic emits in, keeps the committed YAML stable
    # across pydantic versions; properties keep the models' field order, which is meaningful.
    ordered: dict[str, Any] = {key: node[key] for key in _KEY_ORDER if key in node}
    if "x-kubernetes-validations" in ordered:
        ordered["x-kubernetes-validations"] = [
            {key: rule[key] for key in _VALIDATION_KEY_ORDER if key in rule}
            for rule in ordered["x-kubernetes-validations"]
        ]
    return ordered


def overlay(base: Mapping[str, Any], over: Mapping[str, Any], path: str = "") -> dict[str, Any]:
    """`over` laid on `base`: properties, items and additionalProperties merged node by node,
    `required` joined, any other keyword of `over` winning. `over` may only constrain or
    describe fields `base` has: a property it alone has is a SchemaError."""
    out = dict(base)
    for key, value in over.items():
        if key == "properties":
            props = dict(base.get("properties", {}))
            for name, prop in value.items():
                if name not in props:
                    raise SchemaError(f"{path}.{name}: not a field of the embedded schema")
                props[name] = overlay(props[name], prop, f"{path}.{name}")
            out[key] = props
        elif key in ("items", "additionalProperties") and isinstance(base.get(key), Mapping):
            out[key] = overlay(base[key], value, f"{path}[]")
        elif key == "required":
            out[key] = [*base.get(key, []), *(k for k in value if k not in base.get(key, []))]
        else:
            out[key] = value
    return out


def _ordered_tree(node: Mapping[str, Any], path: str = "") -> dict[str, Any]:
    unknown = set(node) - _ALLOWED_KEYS
    if unknown:
        raise SchemaError(f"{path}: keywords not allowed in a CRD schema: {sorted(unknown)}")
    out = _ordered(dict(node))
    if "properties" in out:
        out["properties"] = {
            name: _ordered_tree(prop, f"{path}.{name}") for name, prop in out["properties"].items()
        }
    for key in ("items", "additionalProperties"):
        if isinstance(out.get(key), Mapping):
            out[key] = _ordered_tree(out[key], f"{path}[]")
    return out


# Where the spec holds a core/v1 PodTemplateSpec: the models give its overlay (bounds,
# descriptions, rules), api.podtemplate the schema under it.
_POD_TEMPLATE_PATHS: Final = (("template",), ("roles", "[]", "template"))


def embed_pod_templates(spec: dict[str, Any], template: Mapping[str, Any]) -> dict[str, Any]:
    """The spec schema with each pod template node laid over the PodTemplateSpec `template`."""
    for path in _POD_TEMPLATE_PATHS:
        parent = spec
        for part in path[:-1]:
            parent = parent["items"] if part == "[]" else parent["properties"][part]
        name = path[-1]
        parent["properties"][name] = _ordered_tree(
            overlay(template, parent["properties"][name], ".".join(path))
        )
    return spec


# --- the CRD --------------------------------------------------------------------------------

# Worker pods are named `<name>-<rank>` (`<name>-<role>-<index>` with roles), the hostnames
# under the headless Service `<name>`: the name must be a DNS-1035 label, and short enough to
# take the longest pod name.
_NAME_PATTERN: Final = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
_DNS_LABEL_MAX: Final = 63

_ROOT_RULES: Final = [
    {
        "rule": "!has(self.spec.replicas) || self.metadata.name.size() + 1 + "
        f"string(self.spec.replicas - 1).size() <= {_DNS_LABEL_MAX}",
        "message": "metadata.name is too long for spec.replicas: the worker pod names "
        f"<metadata.name>-<rank> must fit in {_DNS_LABEL_MAX} characters",
        "fieldPath": ".metadata.name",
    },
    {
        "rule": "!has(self.spec.roles) || self.spec.roles.all(r, self.metadata.name.size() + "
        f"r.name.size() + 2 + string(r.replicas - 1).size() <= {_DNS_LABEL_MAX})",
        "message": "metadata.name is too long for spec.roles: the worker pod names "
        f"<metadata.name>-<role>-<index> must fit in {_DNS_LABEL_MAX} characters",
        "fieldPath": ".metadata.name",
    },
]

PRINTER_COLUMNS: Final = [
    {
        "name": "Phase",
        "type": "string",
        "jsonPath": ".status.phase",
        "description": "Phase of the job.",
    },
    {
        "name": "Ready",
        "type": "integer",
        "jsonPath": ".status.workers.ready",
        "description": "Workers whose pod is Ready.",
    },
    {
        "name": "Epoch",
        "type": "integer",
        "jsonPath": ".status.epoch",
        "description": "The gang's restart epoch.",
    },
    {
        "name": "World",
        "type": "integer",
        "jsonPath": ".status.worldSize",
        "description": "WORLD_SIZE of the current epoch.",
    },
    {
        "name": "Restarts",
        "type": "integer",
        "jsonPath": ".status.restarts.total",
        "description": "Gang restarts so far.",
    },
    {
        "name": "Replicas",
        "type": "integer",
        "jsonPath": ".spec.replicas",
        "description": "Gang size, for a job of one role written with replicas.",
        "priority": 1,
    },
    {
        # In the wide view, as Replicas: the default view of a one-role job stays as it was,
        # and Ready counts every role's workers.
        "name": "Roles",
        "type": "string",
        "jsonPath": ".status.rolesReady",
        "description": "Each running role's ready workers, or the role's state.",
        "priority": 1,
    },
    {
        "name": "Mode",
        "type": "string",
        "jsonPath": ".status.mode",
        "description": "Restart mode in effect.",
        "priority": 1,
    },
    {
        "name": "Step",
        "type": "integer",
        "jsonPath": ".status.progress.step",
        "description": "The gang's training step, as its trainers report it.",
        "priority": 1,
    },
    {
        "name": "Goodput",
        "type": "number",
        "jsonPath": ".status.goodput.ratio",
        "description": "Productive time / wall time since the job started.",
        "priority": 1,
    },
    {
        "name": "Age",
        "type": "date",
        "jsonPath": ".metadata.creationTimestamp",
    },
]


def openapi_schema() -> dict[str, Any]:
    """The `openAPIV3Schema` of the GangJob version."""
    spec = structural_schema(GangJobSpec.model_json_schema(by_alias=True, mode="validation"))
    spec = embed_pod_templates(spec, pod_template_schema())
    status = structural_schema(GangJobStatus.model_json_schema(by_alias=True, mode="validation"))
    root = {
        "description": "A gang of worker pods running one distributed training job, restarted "
        "in place and together when a worker fails.",
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {
                "description": "APIVersion defines the versioned schema of this representation "
                "of an object.",
                "type": "string",
            },
            "kind": {
                "description": "Kind is a string value representing the REST resource this "
                "object represents.",
                "type": "string",
            },
            # The apiserver allows nothing on metadata but restrictions of name and
            # generateName; not even a description.
            "metadata": {
                "type": "object",
                "properties": {
                    "name": {
                        "type": "string",
                        "maxLength": _DNS_LABEL_MAX,
                        "pattern": _NAME_PATTERN,
                    },
                },
            },
            "spec": spec,
            "status": status,
        },
        "x-kubernetes-validations": _ROOT_RULES,
    }
    return _ordered(root)


def build_crd() -> dict[str, Any]:
    """The GangJob CustomResourceDefinition (apiextensions.k8s.io/v1) as a dict."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": KIND,
                "listKind": LIST_KIND,
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": [SHORT_NAME],
                "categories": [CATEGORY],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                },
            ],
        },
    }


# --- files ----------------------------------------------------------------------------------

HEADER: Final = "# generated by `make manifests`; do not edit\n"
CRD_FILE: Final = f"{GROUP}_{PLURAL}.yaml"
KUSTOMIZATION_FILE: Final = "kustomization.yaml"
DEFAULT_OUT_DIR: Final = Path(__file__).resolve().parent.parent / "manifests" / "crd"


class _Dumper(yaml.SafeDumper):
    # Inlined $refs share sub-dicts; anchors and aliases would make the CRD unreadable.
    def ignore_aliases(self, data: Any) -> bool:
        return True


def to_yaml(doc: Mapping[str, Any]) -> str:
    """A manifest as YAML with the generated-file header, keys in the dict's order."""
    body = yaml.dump(
        dict(doc), Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100
    )
    return HEADER + body


def render() -> dict[str, str]:
    """The generated files of `manifests/crd/`, by file name."""
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [CRD_FILE],
    }
    return {CRD_FILE: to_yaml(build_crd()), KUSTOMIZATION_FILE: to_yaml(kustomization)}


def check(out_dir: Path) -> list[str]:
    """Unified diffs of every file in `out_dir` that differs from what `render` generates."""
    diffs: list[str] = []
    for name, generated in render().items():
        path = out_dir / name
        committed = path.read_text() if path.exists() else ""
        if committed != generated:
            diffs.append(
                "".join(
                    difflib.unified_diff(
                        committed.splitlines(keepends=True),
                        generated.splitlines(keepends=True),
                        fromfile=f"{path} (committed)",
                        tofile=f"{path} (generated)",
                    )
                )
            )
    return diffs


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: write the CRD manifests, or with --check exit 1 with a diff if they are stale."""
    parser = argparse.ArgumentParser(
        prog="python -m api.crd", description="Generate the GangJob CRD from api.v1alpha1."
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="do not write; exit 1 and print a diff if the files differ from the generated ones",
    )
    parser.add_argument(
        "--out-dir", type=Path, default=DEFAULT_OUT_DIR, help="default: %(default)s"
    )
    args = parser.parse_args(argv)
    out_dir: Path = args.out_dir
    if args.check:
        diffs = check(out_dir)
        for diff in diffs:
            sys.stdout.write(diff)
        if diffs:
            print(f"{out_dir} is stale: run `make manifests`", file=sys.stderr)
            return 1
        return 0
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, content in render().items():
        (out_dir / name).write_text(content)
        print(out_dir / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
