"""The controller's command line: durations and the leader election's timing, checked before
anything starts (a mistyped flag is an exit 2 naming it, as kube-controller-manager does)."""

from __future__ import annotations

import pytest

from controller.main import main, parser


def test_leader_election_timing_reads_kube_style_durations() -> None:
    args = parser().parse_args(
        [
            "--leader-elect-lease-duration=6s",
            "--leader-elect-renew-deadline=4",
            "--leader-elect-retry-period=1s",
            "--recheck-seconds=5",
        ]
    )
    assert (
        args.leader_elect_lease_duration,
        args.leader_elect_renew_deadline,
        args.leader_elect_retry_period,
    ) == (6.0, 4.0, 1.0)
    assert args.recheck_seconds == 5.0
    defaults = parser().parse_args([])
    assert (
        defaults.leader_elect_lease_duration,
        defaults.leader_elect_renew_deadline,
        defaults.leader_elect_retry_period,
    ) == (15.0, 10.0, 2.0)


@pytest.mark.parametrize("value", ["soon", "0s", "-3"])
def test_a_duration_that_is_not_one_is_refused_naming_the_flag(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parser().parse_args([f"--leader-elect-lease-duration={value}"])
    assert exited.value.code == 2
    assert "--leader-elect-lease-duration" in capsys.readouterr().err


def test_a_lease_shorter_than_its_renew_deadline_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["--leader-elect-lease-duration=5s", "--leader-elect-renew-deadline=10s"])
    assert code == 2
    assert "--leader-elect-lease-duration must be greater than" in capsys.readouterr().err


def test_a_renew_deadline_within_the_retry_jitter_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["--leader-elect-renew-deadline=2s", "--leader-elect-retry-period=2s"])
    assert code == 2
    assert (
        "--leader-elect-renew-deadline must be greater than 1.2 * --leader-elect-retry-period"
        in capsys.readouterr().err
    )
