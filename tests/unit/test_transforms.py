"""The caches' transforms keep what the controller reads: on real objects, the views parsed from
the trimmed object equal those parsed from the full one, and so do the stores' index keys.

testdata/pod_sim.json and node_sim.json are a worker pod (built by the controller, run by KWOK)
and a node as the apiserver of the `sim` cluster returned them, managedFields included;
pod_kubelet.json and node_kubelet.json are the same objects carrying what a real kubelet adds
(container IDs, mounts, allocated resources, a restart after an OOM kill, an unhealthy GPU; a
node's images, nodeInfo, taints).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from api.v1alpha1 import parse_gangjob
from controller.k8s import JsonDict
from controller.k8s.store import gangjob_index, node_index, object_key
from controller.k8s.transforms import strip_managed_fields, trim_node, trim_pod
from controller.manager import arrival_only
from controller.policy.views import NodeView, PodView
from tests.unit.builders import job_dict, make_node, make_pod

DATA = Path(__file__).parent / "testdata"
ODD_VALUES: tuple[Any, ...] = (None, 0, "x", [{}], {"x": 1})


def load(name: str) -> JsonDict:
    obj: JsonDict = json.loads((DATA / name).read_text())
    return obj


def kubelet_pod_variants() -> dict[str, JsonDict]:
    pod = load("pod_kubelet.json")
    evicted = copy.deepcopy(pod)
    evicted["metadata"]["deletionTimestamp"] = "2026-11-24T18:50:00Z"
    evicted["metadata"]["deletionGracePeriodSeconds"] = 30
    evicted["status"] |= {
        "phase": "Failed",
        "reason": "Evicted",
        "message": "The node was low on resource: memory.",
    }
    failed = copy.deepcopy(pod)
    trainer = failed["status"]["containerStatuses"][0]
    trainer["state"] = {
        "terminated": {
            "containerID": "containerd://" + "e5" * 32,
            "exitCode": 1,
            "finishedAt": "2026-11-24T18:49:02Z",
            "message": "Traceback (most recent call last): ...",
            "reason": "Error",
            "startedAt": "2026-11-24T18:47:20Z",
        }
    }
    trainer["allocatedResourcesStatus"][0]["resources"][0]["health"] = "Unknown"
    return {"kubelet": pod, "kubelet-evicted": evicted, "kubelet-failed": failed}


def pods() -> dict[str, JsonDict]:
    built = {
        "built-running": make_pod(0, epoch=1),
        "built-failed": make_pod(1, phase="Failed", exit_code=137),
        "built-pending": make_pod(2, phase="Pending"),
        "built-terminating": make_pod(3, terminating=True, epoch=2),
        "built-stray": make_pod(None, name="stray"),
    }
    return {"sim": load("pod_sim.json"), **kubelet_pod_variants(), **built}


def nodes() -> dict[str, JsonDict]:
    return {
        "sim": load("node_sim.json"),
        "kubelet": load("node_kubelet.json"),
        "built": make_node("n1", taints=("gpu-lost",), conditions={"DiskPressure": "True"}),
        "built-not-ready": make_node("n2", ready="False", features=()),
    }


@pytest.mark.parametrize(("name", "pod"), pods().items(), ids=pods().keys())
def test_a_trimmed_pod_reads_as_the_full_one(name: str, pod: JsonDict) -> None:
    original = copy.deepcopy(pod)
    trimmed = trim_pod(pod)
    assert pod == original  # a transform builds anew; the object given stays whole
    assert PodView.from_pod(trimmed) == PodView.from_pod(pod)
    assert object_key(trimmed) == object_key(pod)
    assert gangjob_index(trimmed) == gangjob_index(pod)
    assert node_index(trimmed) == node_index(pod)
    assert trimmed["metadata"] == {k: v for k, v in pod["metadata"].items() if k != "managedFields"}


@pytest.mark.parametrize(("name", "node"), nodes().items(), ids=nodes().keys())
def test_a_trimmed_node_reads_as_the_full_one(name: str, node: JsonDict) -> None:
    original = copy.deepcopy(node)
    trimmed = trim_node(node)
    assert node == original
    assert NodeView.from_node(trimmed) == NodeView.from_node(node)
    assert object_key(trimmed) == object_key(node)
    assert "managedFields" not in trimmed["metadata"]


def test_real_objects_shrink() -> None:
    def size(obj: JsonDict) -> int:
        return len(json.dumps(obj))

    for pod in (load("pod_sim.json"), load("pod_kubelet.json")):
        assert size(trim_pod(pod)) < size(pod) / 4
    trimmed = trim_node(load("node_kubelet.json"))
    assert "images" not in trimmed["status"]
    assert "nodeInfo" not in trimmed["status"]


def paths(obj: Any, prefix: tuple[str | int, ...] = ()) -> Iterator[tuple[str | int, ...]]:
    """Every path into a JSON value, but not into managedFields (which every transform drops)."""
    items: list[tuple[str | int, Any]] = []
    if isinstance(obj, dict):
        items = [(k, v) for k, v in obj.items() if k != "managedFields"]
    elif isinstance(obj, list):
        items = list(enumerate(obj))
    for key, value in items:
        yield (*prefix, key)
        yield from paths(value, (*prefix, key))


def replaced(obj: JsonDict, path: tuple[str | int, ...], value: Any) -> JsonDict:
    out: JsonDict = json.loads(json.dumps(obj))  # a deep copy, several times faster
    parent: Any = out
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return out


def few_images(node: JsonDict) -> JsonDict:
    node["status"]["images"] = node["status"]["images"][:2]  # 50 alike add only time
    return node


def outcome(parse: Callable[[JsonDict], Any], obj: JsonDict) -> Any:
    try:
        return parse(obj)
    except Exception as error:  # the same failure on both sides is as good as the same view
        return type(error)


@pytest.mark.parametrize(
    ("parse", "trim", "obj"),
    [
        (PodView.from_pod, trim_pod, load("pod_kubelet.json")),
        (PodView.from_pod, trim_pod, kubelet_pod_variants()["kubelet-failed"]),
        (NodeView.from_node, trim_node, few_images(load("node_kubelet.json"))),
    ],
    ids=["pod", "failed-pod", "node"],
)
def test_odd_values_anywhere_read_the_same_trimmed(
    parse: Callable[[JsonDict], Any], trim: Callable[[JsonDict], JsonDict], obj: JsonDict
) -> None:
    """Whatever value of whatever type sits at any path, the trimmed object reads the same:
    the transform keeps what it does not understand rather than judge it."""
    for path in paths(obj):
        for value in ODD_VALUES:
            odd = replaced(obj, path, value)
            assert outcome(parse, trim(odd)) == outcome(parse, odd), (path, value)


def test_strip_managed_fields_keeps_the_rest() -> None:
    job = job_dict(2, status={"epoch": 3, "barrierEpoch": 3})
    job["metadata"]["managedFields"] = load("pod_sim.json")["metadata"]["managedFields"]
    stripped = strip_managed_fields(job)
    expected = copy.deepcopy(job)
    del expected["metadata"]["managedFields"]
    assert stripped == expected
    assert parse_gangjob(stripped) == parse_gangjob(job)
    assert strip_managed_fields(stripped) is stripped


def test_an_arrival_stays_an_arrival_and_a_status_change_does_not_become_one() -> None:
    old = load("pod_kubelet.json")
    arrived = copy.deepcopy(old)
    arrived["metadata"]["annotations"]["gangjob.io/epoch"] = "2"
    arrived["metadata"]["resourceVersion"] = "99999"
    arrived["metadata"]["managedFields"][0]["time"] = "2026-11-24T18:55:00Z"
    assert arrival_only(old, arrived)
    assert arrival_only(trim_pod(old), trim_pod(arrived))
    restarted = copy.deepcopy(arrived)
    restarted["status"]["containerStatuses"][0]["restartCount"] = 2
    assert not arrival_only(old, restarted)
    assert not arrival_only(trim_pod(old), trim_pod(restarted))
