"""Builds `agent.pyz`: the agent package (and the protocol names of `api.constants`) as an
executable zipapp, to be copied into any image with python3 >= 3.11 (`python3 agent.pyz
sidecar|wrap -- ...`)."""

from __future__ import annotations

import shutil
import sys
import tempfile
import zipapp
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
API_CONSTANTS = PACKAGE.parent / "api" / "constants.py"
INTERPRETER = "/usr/bin/env python3"
_ROOT_MAIN = """\
import sys

from agent.cli import main

sys.exit(main())
"""


def build_zipapp(dest: Path) -> Path:
    """Writes the zipapp to `dest` (a file path, or a directory to hold `agent.pyz`) and returns
    its path. Only the agent's sources and `api/constants.py` go in: no bytecode,
    no tests."""
    dest = Path(dest)
    if dest.is_dir():
        dest = dest / "agent.pyz"
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="agent-pyz-") as tmp:
        root = Path(tmp)
        shutil.copytree(
            PACKAGE,
            root / "agent",
            ignore=lambda _d, names: [n for n in names if not n.endswith(".py")],
        )
        # The protocol's names have one home, api/constants.py (standard library only): it goes
        # in beside the agent, with an empty `api` package around it.
        (root / "api").mkdir()
        (root / "api" / "__init__.py").write_text("")
        shutil.copy2(API_CONSTANTS, root / "api" / "constants.py")
        (root / "__main__.py").write_text(_ROOT_MAIN)
        zipapp.create_archive(root, dest, interpreter=INTERPRETER, compressed=True)
    return dest


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("agent.pyz")
    print(build_zipapp(target))
