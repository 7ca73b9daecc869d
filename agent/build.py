"""Builds `agent.pyz`: the agent package alone as an executable zipapp, to be copied into any
image with python3 >= 3.11 (`python3 agent.pyz sidecar|wrap -- ...`)."""

from __future__ import annotations

import shutil
import sys
import tempfile
import zipapp
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
INTERPRETER = "/usr/bin/env python3"
_ROOT_MAIN = """\
import sys

from agent.cli import main

sys.exit(main())
"""


def build_zipapp(dest: Path) -> Path:
    """Writes the zipapp to `dest` (a file path, or a directory to hold `agent.pyz`) and returns
    its path. Only the agent's sources go in: no bytecode, no tests."""
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
        (root / "__main__.py").write_text(_ROOT_MAIN)
        zipapp.create_archive(root, dest, interpreter=INTERPRETER, compressed=True)
    return dest


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("agent.pyz")
    print(build_zipapp(target))
