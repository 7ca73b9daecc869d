"""The controller image localcluster builds holds what Dockerfile.controller builds: the same
packages of the checkout, dependencies, console script, user, environment and entrypoint."""

from __future__ import annotations

import json
import re
import tomllib

from localcluster import controllerimage as ci

DOCKERFILE = ci.DOCKERFILE.read_text()
PYPROJECT = tomllib.loads(ci.PYPROJECT.read_text())


def final_stage() -> str:
    return DOCKERFILE[DOCKERFILE.rindex("\nFROM ") :]


def test_the_recipe_is_what_the_dockerfile_and_pyproject_say() -> None:
    recipe = ci.read_recipe()
    stage = final_stage()
    assert recipe.user == re.search(r"^USER (\S+)$", stage, re.M).group(1)  # type: ignore[union-attr]
    entry = re.search(r"^ENTRYPOINT (.+)$", stage, re.M).group(1)  # type: ignore[union-attr]
    assert list(recipe.entrypoint) == json.loads(entry)
    assert "PYTHONUNBUFFERED=1" in recipe.env
    assert "PYTHONDONTWRITEBYTECODE=1" in recipe.env
    assert recipe.dependencies == tuple(PYPROJECT["project"]["dependencies"])
    assert recipe.ports == (8080, 8081)


def test_the_dockerfile_copies_every_package_the_image_holds() -> None:
    """`pip wheel .` in the Dockerfile packs pyproject's packages from what it COPYs: a package
    the local image holds but the Dockerfile leaves out would break only the Docker build."""
    recipe = ci.read_recipe()
    assert set(recipe.packages) <= set(recipe.copied)
    assert "pyproject.toml" in recipe.copied


def test_the_image_runs_the_console_script_pip_would_write() -> None:
    recipe = ci.read_recipe()
    files = ci.project_files(recipe)
    (command,) = recipe.entrypoint
    script = files[f"{ci.BIN_IN_IMAGE}/{command}"]
    assert isinstance(script, bytes)
    target = PYPROJECT["project"]["scripts"][command]
    module, func = target.split(":")
    assert f"from {module} import {func}" in script.decode()
    compile(script, command, "exec")
    for package in recipe.packages:
        assert f"{ci.SITE_IN_IMAGE}/{package}/__init__.py" in files
    assert not any("__pycache__" in path for path in files)
