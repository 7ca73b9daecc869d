"""The Python client's example in README.md, run as written against the real kubelet: a function
submitted as a 2-worker GangJob of the PyTorch image, waited for, its rank 1 log printed, the job
deleted. Its only setting is the user's: a kubeconfig whose context's namespace is the test's."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import pytest
import yaml

from controller.k8s import GANGJOBS, Kube
from localcluster.cluster import Cluster
from localcluster.node import ensure_trainer_image
from localcluster.tools import REPO, ControllerProcess

pytestmark = pytest.mark.e2e


def readme_example() -> str:
    text = (REPO / "README.md").read_text()
    section = text[text.index("### From Python") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README.md: no Python example under `### From Python`"
    return match.group(1)


async def test_the_readme_example_runs_as_written(
    node_kube: Kube, node_cluster: Cluster, node_namespace: str, controller: ControllerProcess,
    tmp_path: Path,
) -> None:  # fmt: skip
    ensure_trainer_image(node_cluster, sys.stderr)
    config = yaml.safe_load(node_cluster.kubeconfig.read_text())
    for entry in config["contexts"]:
        entry["context"]["namespace"] = node_namespace
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    script = tmp_path / "example.py"
    script.write_text(readme_example())
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(script), cwd=tmp_path, env={"KUBECONFIG": str(kubeconfig)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 400)
    assert proc.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    name, phase, restarts = lines[0].split()
    assert (phase, restarts) == ("Succeeded", "0"), lines
    assert lines[1:] == [f"rank 1 step {i}" for i in range(3)], lines
    found = await node_kube.list(GANGJOBS, node_namespace)
    assert name not in [j["metadata"]["name"] for j in found.items]  # deleted (or going)
