"""Unit tests of api.naming: the names of a gang's Service and worker pods."""

from __future__ import annotations

from api.builders import gangjob, role
from api.naming import coordinator_pod_name, master_addr, pod_name, service_name, worker_pod_name
from api.v1alpha1 import parse_gangjob
from tests.unit.builders import JOB_NAME, NAMESPACE, make_job

SIMPLE = {"spec": {"containers": [{"name": "trainer", "image": "t:1", "command": ["run"]}]}}


def test_a_shorthand_job_names_its_workers_by_number() -> None:
    job = make_job(replicas=3)
    assert [worker_pod_name(job, w) for w in range(3)] == ["llama-0", "llama-1", "llama-2"]
    assert coordinator_pod_name(job) == pod_name(JOB_NAME, 0) == "llama-0"
    assert service_name(JOB_NAME) == JOB_NAME


def test_a_job_with_roles_names_its_workers_by_role_and_index() -> None:
    body = gangjob(
        JOB_NAME,
        None,
        namespace=NAMESPACE,
        spec={
            "roles": [role("ps", 1, SIMPLE), role("worker", 2, SIMPLE)],
            "coordinator": {"role": "worker", "index": 1},
        },
    )
    job = parse_gangjob(body)
    assert [worker_pod_name(job, w) for w in range(3)] == [
        "llama-ps-0",
        "llama-worker-0",
        "llama-worker-1",
    ]
    assert coordinator_pod_name(job) == "llama-worker-1"
    assert master_addr(JOB_NAME, coordinator_pod_name(job)) == "llama-worker-1.llama"


def test_master_addr_goes_through_the_headless_service() -> None:
    assert master_addr("llama") == "llama-0.llama"
