"""docs/api.md is generated from the API models: the golden file, and what it documents."""

from __future__ import annotations

from pathlib import Path

from api import reference


def test_committed_reference_is_generated() -> None:
    assert reference.check(reference.DEFAULT_OUT) == "", "run `python -m api.reference`"


def test_check_reports_a_stale_file(tmp_path: Path) -> None:
    out = tmp_path / "api.md"
    assert reference.main(["--check", "--out", str(out)]) == 1
    assert reference.main(["--out", str(out)]) == 0
    assert reference.main(["--check", "--out", str(out)]) == 0


def test_every_spec_and_status_field_is_documented_with_its_description() -> None:
    text = reference.render()
    for needle in (
        "### `spec.restart`",
        '| `mode` | string | `"Pod"` |',
        "### `spec.failurePolicy.rules[]`",
        "### `status.lastRestart`",
        "`barrierEpoch`",
        "Gang size: the number of workers (ranks), for a job of one role.",
        "### `spec.roles[]`",
    ):
        assert needle in text, needle
