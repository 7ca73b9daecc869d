"""localcluster.outofcluster without a cluster: what counts as built, and a controller that
exits before it is ready."""

from __future__ import annotations

from pathlib import Path

import pytest

from localcluster import outofcluster
from localcluster.addons import free_ports
from localcluster.outofcluster import Addon, AddonProcess
from localcluster.procs import launch


class AddonError(RuntimeError):
    pass


ADDON = Addon(
    component="demo",
    binary="demo-manager",
    module="example.com/demo",
    version="v1.0.0",
    package=".",
    cold_build_seconds=1,
    error=AddonError,
    manifests={"webhooks.yaml": "config/webhooks.yaml"},
)


def test_built_means_the_binary_the_crds_and_every_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(outofcluster, "cache_root", lambda: tmp_path)
    assert ADDON.binary_path() == tmp_path / "demo" / "v1.0.0" / "demo-manager"
    assert ADDON.field_manager == "localcluster-demo"
    ADDON.crd_dir().mkdir(parents=True)
    ADDON.binary_path().write_text("")
    assert not ADDON.is_built()
    (ADDON.crd_dir() / "demo.yaml").write_text("")
    assert not ADDON.is_built()
    (ADDON.cache_dir() / "webhooks.yaml").write_text("")
    assert ADDON.is_built()


def test_a_controller_that_exits_is_reported_with_its_log_and_undone_once(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    log = tmp_path / "demo.log"
    proc = launch("demo", ["sh", "-c", "echo cannot start; exit 3"], log)
    undone: list[str] = []
    (port,) = free_ports(1)
    running = AddonProcess(ADDON, proc, work, log, port, on_stop=lambda: undone.append("x"))
    with pytest.raises(AddonError, match=r"demo-manager exited(.|\n)*cannot start"):
        running.wait_ready(timeout=30)
    assert undone == ["x"]
    assert not work.exists()
    assert not running.stop()
    assert undone == ["x"]
