"""The scale benchmark's reading of the apiserver's own counters (`ApiSample`): requests by
verb and resource, watch bytes by resource, and what changed within a repetition."""

from __future__ import annotations

from benchmarks.scale.observer import ApiSample
from benchmarks.scale.stats import _apiserver

METRICS = """# HELP apiserver_request_total Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="status",verb="PATCH",version="v1"} 12
apiserver_request_total{code="409",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="status",verb="PATCH",version="v1"} 1
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="gangjob.io",resource="gangjobs",scope="resource",subresource="status",verb="PUT",version="v1alpha1"} 4
apiserver_watch_events_sizes_sum{group="",resource="pods",version="v1"} 2.097152e+06
apiserver_watch_events_sizes_count{group="",resource="pods",version="v1"} 100
"""  # noqa: E501


def test_requests_are_summed_over_codes_and_watch_bytes_read_by_kind() -> None:
    sample = ApiSample.parse(METRICS)
    assert sample.requests == {
        "PATCH pods/status": 13.0,
        "POST pods": 3.0,
        "PUT gangjobs/status": 4.0,
    }
    assert sample.watch_bytes == {"pods": 2097152.0}


def test_a_repetition_counts_what_changed_and_sums_its_aggregates() -> None:
    before = ApiSample.parse(METRICS)
    after = ApiSample.parse(
        METRICS.replace("} 12\n", "} 1012\n").replace("2.097152e+06", "6.291456e+06")
    )
    delta = after.since(before)
    assert delta == {"requests": {"PATCH pods/status": 1000}, "watch_bytes": {"pods": 4194304}}
    summary = _apiserver([delta])
    assert summary["pod_status_writes"] == 1000
    assert summary["gangjob_writes"] == 0
    assert summary["watch_bytes"] == 4194304
    assert _apiserver([])["requests"] is None
