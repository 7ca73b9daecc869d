"""Shell completion of `gangjob` and `kubectl gangjob`: the scripts for bash, zsh and fish, and
what they ask for (`gangjob __complete WORD...`): the commands, a command's flags, and the
GangJobs a command takes, read from the cluster the words so far point at.

kubectl completes a plugin's arguments by running `kubectl_complete-<plugin>` with them and
reading cobra's format (candidates, one a line, then `:<directive>`): `kubectl_complete` is
that script."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Callable, Sequence

COMPLETE = "__complete"
"""The hidden first argument the completion scripts call `gangjob` with."""
TAKES_A_JOB = ("status", "logs", "restart", "scale", "delete", "report")
NO_FILE_COMPLETION = 4  # cobra's ShellCompDirectiveNoFileComp


def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _flags(p: argparse.ArgumentParser) -> list[str]:
    return [s for a in p._actions for s in a.option_strings if s.startswith("--") or len(s) == 2]


def _takes_value(p: argparse.ArgumentParser, flag: str) -> bool:
    for action in p._actions:
        if flag in action.option_strings:
            return action.nargs != 0
    return False


def _option(words: Sequence[str], *names: str) -> str | None:
    """The value of the last of `names` among the words (`-n ns`, `--namespace=ns`)."""
    found = None
    for i, word in enumerate(words):
        for name in names:
            if word == name and i + 1 < len(words):
                found = words[i + 1]
            elif word.startswith(f"{name}="):
                found = word.split("=", 1)[1]
    return found


def job_names(words: Sequence[str]) -> list[str]:
    """The GangJobs of the namespace the words give, in their cluster; none if it cannot be
    reached (a completion never fails out loud)."""
    from gangjob.client import AsyncClient  # only when a job's name is completed

    async def names() -> list[str]:
        client = await AsyncClient.connect(
            _option(words, "--kubeconfig"),
            context=_option(words, "--context"),
            namespace=_option(words, "-n", "--namespace"),
        )
        async with client:
            return [job.name for job in await client.list()]

    with contextlib.suppress(Exception):
        return asyncio.run(asyncio.wait_for(names(), 10))
    return []


def candidates(
    p: argparse.ArgumentParser,
    words: Sequence[str],
    jobs: Callable[[Sequence[str]], list[str]] = job_names,
) -> list[str]:
    """What may follow: `words` are the arguments so far, the last one the word being typed."""
    *before, typed = list(words) or [""]
    commands = _subparsers(p)
    if not before:
        return [c for c in commands if c.startswith(typed)]
    sub = commands.get(before[0])
    if sub is None:
        return []
    if typed.startswith("-"):
        return [f for f in _flags(sub) if f.startswith(typed)]
    if len(before) > 1 and before[-1].startswith("-") and _takes_value(sub, before[-1]):
        action = next(a for a in sub._actions if before[-1] in a.option_strings)
        return [str(c) for c in action.choices or [] if str(c).startswith(typed)]
    if before[0] == "completion":
        return [s for s in SCRIPTS if s.startswith(typed)]
    if before[0] in TAKES_A_JOB:
        return [name for name in jobs(before) if name.startswith(typed)]
    return []


def bash() -> str:
    return """\
# gangjob completion for bash: source <(gangjob completion bash)
_gangjob() {
    local IFS=$'\\n'
    COMPREPLY=($(gangjob __complete "${COMP_WORDS[@]:1:COMP_CWORD}" 2>/dev/null))
}
complete -o default -F _gangjob gangjob
"""


def zsh() -> str:
    return "# gangjob completion for zsh: source <(gangjob completion zsh)\n" + (
        "autoload -U +X bashcompinit && bashcompinit\n" + bash().split("\n", 1)[1]
    )


def fish() -> str:
    return """\
# gangjob completion for fish: gangjob completion fish | source
complete -c gangjob -f -a '(gangjob __complete (commandline -opc)[2..-1] (commandline -ct))'
"""


SCRIPTS: dict[str, Callable[[], str]] = {"bash": bash, "zsh": zsh, "fish": fish}


def kubectl_complete() -> int:
    """`kubectl_complete-gangjob ARGS...`: what kubectl asks a plugin for, in cobra's format."""
    from cli.main import parser

    for word in candidates(parser("kubectl gangjob"), sys.argv[1:]):
        print(word)
    print(f":{NO_FILE_COMPLETION}")
    return 0
