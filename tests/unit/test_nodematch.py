"""Which nodes a template may land on by labels and name (`controller.policy.nodematch`), with the
scheduler's reading of `nodeSelector` and required node affinity."""

from __future__ import annotations

from typing import Any

import pytest

from controller.policy.nodematch import allows
from controller.policy.views import NodeView
from tests.unit.builders import make_node

NODE = NodeView.from_node(make_node("gpu-1", labels={"pool": "gpu", "gen": "9", "zone": "a"}))


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
            }
        }
    }


def expr(key: str, op: str, *values: str) -> dict[str, Any]:
    e: dict[str, Any] = {"key": key, "operator": op}
    if values:
        e["values"] = list(values)
    return {"matchExpressions": [e]}


def test_no_constraint_allows_every_node() -> None:
    assert allows({}, NODE)
    assert allows({"affinity": {"podAffinity": {}}}, NODE)


def test_the_node_selector_needs_every_pair() -> None:
    assert allows({"nodeSelector": {"pool": "gpu", "zone": "a"}}, NODE)
    assert not allows({"nodeSelector": {"pool": "gpu", "zone": "b"}}, NODE)
    assert not allows({"nodeSelector": {"rack": "1"}}, NODE)


@pytest.mark.parametrize(
    ("term", "matches"),
    [
        (expr("pool", "In", "cpu", "gpu"), True),
        (expr("pool", "In", "cpu"), False),
        (expr("pool", "NotIn", "cpu"), True),
        (expr("pool", "NotIn", "gpu"), False),
        (expr("rack", "NotIn", "1"), True),  # absent label: NotIn holds
        (expr("pool", "Exists"), True),
        (expr("rack", "Exists"), False),
        (expr("rack", "DoesNotExist"), True),
        (expr("pool", "DoesNotExist"), False),
        (expr("gen", "Gt", "8"), True),
        (expr("gen", "Gt", "9"), False),
        (expr("gen", "Lt", "10"), True),
        (expr("pool", "Gt", "1"), False),  # not an integer
        (expr("rack", "Lt", "1"), False),  # absent
        (expr("pool", "Matches", "gpu"), False),  # an operator the scheduler refuses
        ({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-1"]}]}, True),
        (
            {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["gpu-1"]}]},
            False,
        ),
        ({}, False),  # a term with no requirement matches no node
    ],
)
def test_one_required_term(term: dict[str, Any], matches: bool) -> None:
    assert allows(required(term), NODE) is matches


def test_requirements_of_a_term_are_anded_and_terms_ored() -> None:
    both = {
        "matchExpressions": [
            *expr("pool", "In", "gpu")["matchExpressions"],
            *expr("zone", "In", "b")["matchExpressions"],
        ]
    }
    assert not allows(required(both), NODE)
    assert allows(required(both, expr("zone", "In", "a")), NODE)
    assert not allows(required(), NODE)  # no term at all: nothing matches


def test_selector_and_affinity_must_both_hold() -> None:
    spec = {"nodeSelector": {"pool": "cpu"}, **required(expr("zone", "In", "a"))}
    assert not allows(spec, NODE)
