"""`controller.reconcile.Specs`: a GangJob parsed with the spec model of its last parse while the
spec is unchanged, and as `parse_gangjob` parses it."""

from __future__ import annotations

import copy
from typing import Any, cast

from api.v1alpha1 import parse_gangjob
from controller.k8s import GANGJOBS
from controller.k8s.store import Store
from controller.reconcile import Specs
from tests.unit.builders import job_dict


def test_a_job_keeps_its_spec_model_until_its_spec_changes() -> None:
    store = Store(cast(Any, None), GANGJOBS)
    obj = job_dict(8, status={"epoch": 1})
    store.replace([obj], "1")
    specs = Specs(store, slack=0)
    first = specs.parse(obj)
    workers = first.spec.workers
    again = dict(obj, status={"epoch": 2}, spec=copy.deepcopy(obj["spec"]))  # a status write
    second = specs.parse(again)
    assert second == parse_gangjob(again)
    assert second.spec is first.spec
    assert second.spec.workers is workers  # built once
    assert second.status.epoch == 2
    grown = dict(again, spec={**again["spec"], "replicas": 9})
    third = specs.parse(grown)
    assert third == parse_gangjob(grown)
    assert third.spec is not first.spec
    assert len(third.spec.workers) == 9


def test_the_spec_of_a_job_gone_from_the_cache_is_forgotten() -> None:
    store = Store(cast(Any, None), GANGJOBS)
    specs = Specs(store, slack=0)
    objs = [job_dict(2) for _ in range(3)]
    for i, obj in enumerate(objs):
        obj["metadata"] |= {"uid": f"u{i}", "name": f"j{i}"}
        specs.parse(obj)
    assert len(specs._specs) == 0  # none is in the store: none is kept
    store.replace(objs, "1")
    for obj in objs:
        specs.parse(obj)
    assert len(specs._specs) == 3
