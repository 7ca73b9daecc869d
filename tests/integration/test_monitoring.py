"""GangJob's alerts (manifests/monitoring/prometheusrule.yaml) under the real promtool (Debian's
package, cached by localcluster.prometheus): the rules check, and every alert fires in one case
of testdata/rules_test.yaml and stays quiet in another. No cluster: promtool evaluates the
rules on the series the test file gives."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster import prometheus
from localcluster.tools import REPO

pytestmark = pytest.mark.integration

RULES = REPO / "manifests" / "monitoring" / "prometheusrule.yaml"
CASES = Path(__file__).parent / "testdata" / "rules_test.yaml"


def alerts() -> list[str]:
    spec = yaml.safe_load(RULES.read_text())["spec"]
    return [r["alert"] for g in spec["groups"] for r in g["rules"] if "alert" in r]


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    cases: dict[str, list[bool]] = {}
    for test in yaml.safe_load(CASES.read_text())["tests"]:
        for case in test.get("alert_rule_test", []):
            cases.setdefault(case["alertname"], []).append(bool(case["exp_alerts"]))
    assert sorted(cases) == sorted(alerts())
    for alert, fired in cases.items():
        assert True in fired, f"{alert}: no case where it fires"
        assert False in fired, f"{alert}: no case where it stays quiet"


def test_promtool_passes_the_rules_and_their_cases(tmp_path: Path) -> None:
    spec: dict[str, Any] = yaml.safe_load(RULES.read_text())["spec"]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(spec))
    shutil.copy(CASES, tmp_path / CASES.name)
    promtool = str(prometheus.promtool())
    check = subprocess.run(
        [promtool, "check", "rules", "rules.yaml"], cwd=tmp_path, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in check.stdout
    run = subprocess.run(
        [promtool, "test", "rules", CASES.name], cwd=tmp_path, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    print(run.stdout, run.stderr)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SUCCESS" in run.stdout


def test_promtool_fails_a_case_that_does_not_hold(tmp_path: Path) -> None:
    """The cases can fail: with the low-goodput threshold moved, its firing case does."""
    text = RULES.read_text().replace(
        "(gangjob_goodput_ratio) < 0.8", "(gangjob_goodput_ratio) < 0.5"
    )
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(yaml.safe_load(text)["spec"]))
    shutil.copy(CASES, tmp_path / CASES.name)
    run = subprocess.run(
        [str(prometheus.promtool()), "test", "rules", CASES.name], cwd=tmp_path,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode != 0
    assert "GangJobLowGoodput" in run.stdout + run.stderr
