"""`onMessagePatterns`: the failure-policy matcher on the trainer's termination message. Which
patterns admission takes (RE2 within the part Python's `re` reads alike), which message a
failure carries (its own exit's, not an older one's), how a rule matches it, and that the
kubelet is never left to restart in place an exit whose action a message may change."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from api.failures import FailureClass
from api.v1alpha1 import ExitCodeOperator, FailureAction, message_pattern_error
from controller.policy import classify
from controller.policy.classify import Failure
from controller.policy.views import PodView
from tests.unit.builders import make_job
from tests.unit.test_classify import OPENED, ctx, pod, trainer

NCCL = {"action": "FailJob", "onMessagePatterns": ["NCCL error", r"CUDA error: an illegal"]}


@pytest.mark.parametrize(
    "pattern",
    [
        "NCCL error",
        "CUDA error: an illegal memory access",
        r"(?i)nccl\s+(error|timeout)",
        r"^RuntimeError: .*Connection closed by peer",
        r"exit code \d+",
        r"[.]x\b",
        r"\$HOME",
        r"a+?(?:b|c)(?i:d){2,3}",
        r"\(?paren",
    ],
)
def test_patterns_in_the_common_subset_are_taken(pattern: str) -> None:
    assert message_pattern_error(pattern) is None


@pytest.mark.parametrize(
    "pattern",
    [
        "error$",  # Python's $ also matches before a final newline
        r"\\$",  # an escaped backslash, then the end
        r"\pL",  # RE2 only
        r"\z",  # RE2 only
        r"\Z",  # Python only
        r"(a)\1",  # backreference: Python only
        "(?=x)",  # lookahead: Python only
        "(?P<n>x)",  # named group
        "(?s).",  # flags other than i
        "x(?i)y",  # a global flag not at the start
        "[[:alpha:]]",  # RE2's POSIX class
        "a{,3}",  # Python's {,n}
        "a*+",  # possessive
        "é",  # non-ASCII: case folding differs
        "(unclosed",  # invalid in both
    ],
)
def test_patterns_read_apart_are_refused(pattern: str) -> None:
    error = message_pattern_error(pattern)
    assert error is not None
    assert error.startswith("a pattern of onMessagePatterns must be")
    with pytest.raises(ValidationError, match="onMessagePatterns"):
        make_job(failurePolicy={"rules": [{"action": "FailJob", "onMessagePatterns": [pattern]}]})


def test_a_rule_with_two_matchers_is_refused() -> None:
    rule = {"action": "FailJob", "onMessagePatterns": ["x"], "onFailureClasses": ["Hang"]}
    with pytest.raises(ValidationError, match="exactly one of"):
        make_job(failurePolicy={"rules": [rule]})


def failure(message: str | None) -> Failure:
    return Failure(
        worker=1,
        failure_class=FailureClass.PROCESS_EXIT,
        detail="x",
        container="trainer",
        exit_code=1,
        exit_codes={"trainer": 1},
        message=message,
    )


@pytest.mark.parametrize(
    ("message", "action", "rule"),
    [
        ("RuntimeError: NCCL error in: ../nccl.cpp:1\nunhandled system error", "FailJob", 0),
        ("CUDA error: an illegal memory access was encountered", "FailJob", 0),
        ("nccl error", "RestartGang", None),  # case-sensitive unless (?i)
        ("ValueError: bad batch", "RestartGang", None),
        (None, "RestartGang", None),
    ],
)
def test_a_rule_matches_a_message_containing_a_pattern(
    message: str | None, action: str, rule: int | None
) -> None:
    job = make_job(failurePolicy={"rules": [NCCL]})
    decision = classify.decide(job, failure(message))
    assert (decision.action, decision.rule) == (FailureAction(action), rule)
    assert not decision.by_exit_code


def test_first_match_wins_between_exit_codes_and_messages() -> None:
    rules = [
        {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [1]}},
        NCCL,
    ]
    job = make_job(failurePolicy={"rules": rules})
    assert classify.decide(job, failure("NCCL error")).action is FailureAction.IGNORE


def terminated_pod(message: str, *, last: bool = False, at: str = "2026-05-01T10:05:00Z") -> Any:
    obj = pod(phase="Failed")
    state = {"terminated": {"exitCode": 1, "reason": "Error", "message": message, "finishedAt": at}}
    if last:
        trainer(obj)["lastState"] = state
        trainer(obj)["state"] = {"running": {}}
    else:
        trainer(obj)["state"] = state
    return PodView.from_pod(obj)


def test_the_failure_carries_its_exit_message() -> None:
    found = classify.detect(ctx(), 1, terminated_pod("NCCL error"), None)
    assert found is not None
    assert found.message == "NCCL error"


def test_a_previous_run_message_counts_only_if_it_ended_at_this_epoch() -> None:
    after = (OPENED.replace(minute=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    recent = classify.trainer_message(ctx(), terminated_pod("NCCL error", last=True, at=after))
    assert recent == "NCCL error"
    before = (OPENED.replace(minute=0)).strftime("%Y-%m-%dT%H:%M:%SZ")
    old = classify.trainer_message(ctx(), terminated_pod("NCCL error", last=True, at=before))
    assert old is None


def test_the_kubelet_restarts_no_code_a_message_rule_may_send_elsewhere() -> None:
    job = make_job(failurePolicy={"rules": [NCCL]})
    assert classify.retriable_exit_codes(job) is None
    assert classify.exit_code_action(job, "trainer", 1) is None
    # Another container's exit carries no trainer message: its code decides alone.
    assert classify.exit_code_action(job, "logger", 1) is FailureAction.RESTART_GANG


def test_a_message_rule_after_the_deciding_exit_code_rule_changes_nothing() -> None:
    rules = [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [3]}}, NCCL]
    job = make_job(failurePolicy={"rules": rules})
    assert classify.exit_code_action(job, "trainer", 3) is FailureAction.FAIL_JOB
    assert classify.retriable_exit_codes(job) is None


def test_a_message_rule_that_restarts_the_gang_keeps_restarts_in_place() -> None:
    rules = [
        {"action": "RestartGang", "onMessagePatterns": ["Connection closed by peer"]},
        {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [3]}},
    ]
    job = make_job(failurePolicy={"rules": rules})
    # 3 may be a RestartGang (by its message) or a FailJob: left to the controller.
    assert classify.retriable_exit_codes(job) == (ExitCodeOperator.NOT_IN, [0, 3])


def test_the_detail_quotes_the_last_line_of_the_message() -> None:
    text = "Traceback (most recent call last):\n  ...\nRuntimeError: NCCL error: unhandled\n\n"
    found = classify.detect(ctx(), 1, terminated_pod(text), None)
    assert found is not None
    assert found.detail.endswith("; message: RuntimeError: NCCL error: unhandled")
    assert classify.message_excerpt("x" * 500) == "..." + "x" * 160
