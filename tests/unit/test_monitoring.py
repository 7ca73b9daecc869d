"""The dashboard and the alerts (manifests/monitoring) name only what the controller exports:
every `gangjob_*` metric in their queries is one controller/runtime/metrics.py declares (with
its histogram or counter suffix), and every condition they select on is one GangJobs have."""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from api.constants import ConditionType
from controller.runtime import metrics
from localcluster.tools import REPO

MONITORING = REPO / "manifests" / "monitoring"
METRIC = re.compile(r"\b(gangjob_[a-z0-9_]+)")
CONDITION = re.compile(r'condition=~?"([^"]+)"')


def exported() -> set[str]:
    names: set[str] = set()
    for family in metrics.REGISTRY.collect():
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
    return names


def dashboard_queries() -> list[str]:
    dash: dict[str, Any] = json.loads((MONITORING / "dashboard.json").read_text())
    queries = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    queries += [v["definition"] for v in dash["templating"]["list"] if "definition" in v]
    return queries


def rule_queries() -> list[str]:
    spec = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())["spec"]
    return [r["expr"] for g in spec["groups"] for r in g["rules"]]


def test_every_metric_queried_is_exported() -> None:
    # Labelled series appear in collect() once they have a child: give each one.
    metrics.EPOCH.labels("ns", "job").set(0)
    metrics.BARRIER_EPOCH.labels("ns", "job").set(0)
    metrics.CONDITION.labels("ns", "job", "Stuck").set(0)
    metrics.PROGRESS_STEP.labels("ns", "job").set(0)
    metrics.STEPS_PER_SECOND.labels("ns", "job").set(0)
    metrics.GOODPUT_RATIO.labels("ns", "job").set(0)
    metrics.RESTARTS.labels("ProcessExit", "RestartGang")
    metrics.RESTART_DURATION.labels("Pod")
    metrics.RESTART_STEP.labels("bump")
    metrics.ARRIVAL_REPORTS.labels("accepted")
    metrics.PROGRESS_REPORTS.labels("accepted")
    metrics.BADPUT_SECONDS.labels("restart")
    try:
        names = exported()
        queries = dashboard_queries() + rule_queries()
        used = {m for q in queries for m in METRIC.findall(q)}
        assert used, "no gangjob metric found in the queries"
        assert used <= names, sorted(used - names)
    finally:
        metrics.forget_job("ns", "job")


def test_every_condition_selected_is_one_gangjobs_have() -> None:
    kinds = {str(c) for c in ConditionType}
    selected = {
        name
        for q in dashboard_queries() + rule_queries()
        for alternatives in CONDITION.findall(q)
        for name in alternatives.split("|")
    }
    assert selected
    assert selected <= kinds, sorted(selected - kinds)


def test_the_dashboard_covers_what_the_issue_asks() -> None:
    text = " ".join(dashboard_queries())
    for metric in (
        "gangjob_restarts_total", "gangjob_restart_duration_seconds_bucket",
        "gangjob_restart_controller_seconds_bucket", "gangjob_condition",
        "gangjob_arrival_reports_total", "gangjob_goodput_ratio", "gangjob_badput_seconds_total",
    ):  # fmt: skip
        assert metric in text, metric
