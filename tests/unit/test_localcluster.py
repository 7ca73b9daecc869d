"""localcluster's pure parts: ports, names, the images it builds, the configs it writes."""

from __future__ import annotations

import ctypes
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from localcluster import images, inotify, prebuild, pytorch
from localcluster.cli import parser
from localcluster.cluster import Cluster, Options, kwok_node, kwok_stages, scheduler_config
from localcluster.handle import WELL_KNOWN_SLOTS, ClusterError, Ports
from localcluster.versions import cache_root

USUAL_PORTS = {2379, 2380, 6443, 8080, 10250, 10255, 10256, 10257, 10259}


def all_ports(p: Ports) -> set[int]:
    names = [n for n in dir(Ports) if isinstance(getattr(Ports, n), property)]
    return {getattr(p, n) for n in names}


def test_clusters_of_different_names_never_share_ports() -> None:
    names = [*WELL_KNOWN_SLOTS, "test-updown", "alice", "bob-2"]
    seen: dict[int, str] = {}
    for name in names:
        for port in all_ports(Cluster(name).ports):
            assert port not in seen, f"{name} and {seen[port]} share port {port}"
            assert port not in USUAL_PORTS
            assert port < 32768, "inside Linux's ephemeral port range"
            seen[port] = name


def test_each_cluster_has_its_own_state_dir() -> None:
    dirs = {Cluster(n).dir for n in WELL_KNOWN_SLOTS}
    assert len(dirs) == len(WELL_KNOWN_SLOTS)


@pytest.mark.parametrize("bad", ["", "a/b", "x" * 21, "with space"])
def test_bad_cluster_names_are_refused(bad: str) -> None:
    with pytest.raises(ClusterError):
        Cluster(bad)


STAGES = """\
kind: Stage
metadata:
  name: pod-ready
spec:
  resourceRef:
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
  next:
    statusTemplate: |
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: true
        restartCount: 0
        state:
          running:
            startedAt: {{ $now | Quote }}
      {{ end }}
      initContainerStatuses:
      {{ range .spec.initContainers }}
      - name: {{ .name | Quote }}
        restartCount: 0
      {{ end }}
---
kind: Stage
metadata:
  name: pod-complete
spec:
  selector:
    matchExpressions:
    - key: '.status.phase'
      operator: 'In'
---
kind: Stage
metadata:
  name: pod-delete
spec:
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'
"""


def test_kwok_marks_a_ready_pods_containers_started_as_a_kubelet_does() -> None:
    # A running container without a startup probe is `started` on a real kubelet; without it
    # every simulated worker would read as still starting, and cost the controller's passes
    # what a stuck one does.
    ready = kwok_stages(STAGES).split("---")[0]
    containers, init = ready.split("initContainerStatuses:")
    assert "restartCount: 0\n        started: true\n        state:" in containers
    assert "started" not in init
    with pytest.raises(ValueError, match="pod-ready"):
        kwok_stages(STAGES.replace("name: pod-ready", "name: pod-running"))


def test_kwok_node_declares_restart_all_and_gpus() -> None:
    node = kwok_node("n0", Options(gpus_per_node=4, pods_per_node=300))
    assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    assert node["status"]["declaredFeatures"] == ["RestartAllContainersOnContainerExits"]
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "4"
    assert node["status"]["capacity"]["pods"] == "300"
    assert "nvidia.com/gpu" not in kwok_node("n1", Options())["status"]["allocatable"]


def test_cli_parses_feature_gates_and_refuses_bad_ones(capsys: pytest.CaptureFixture[str]) -> None:
    args = parser().parse_args(["up", "--feature-gates", "A=true,B=false"])
    assert args.feature_gates == {"A": True, "B": False}
    with pytest.raises(SystemExit):
        parser().parse_args(["up", "--feature-gates", "A=yes"])
    assert "A=yes" in capsys.readouterr().err


def test_gang_scheduling_turns_on_its_gates_api_and_plugin(tmp_path: Path) -> None:
    args = parser().parse_args(["up", "--gang-scheduling"])
    assert args.gang_scheduling is True
    opts = Options(gang_scheduling=True, feature_gates={"GangScheduling": False, "X": True})
    # The user's gates win over those gang scheduling brings.
    assert opts.control_plane_gates() == {
        "GenericWorkload": True,
        "GangScheduling": False,
        "TopologyAwareWorkloadScheduling": True,
        "WorkloadAwarePreemption": True,
        "X": True,
    }
    assert Options().control_plane_gates() == {}
    cluster = Cluster("gangunit")
    assert "--runtime-config=scheduling.k8s.io/v1alpha2=true" in cluster._apiserver_cmd([], opts)
    assert not any("runtime-config" in a for a in cluster._apiserver_cmd([], Options()))
    config = scheduler_config(tmp_path / "s.kubeconfig", Options(scheduler_qps=100))
    assert config["clientConnection"] == {
        "kubeconfig": str(tmp_path / "s.kubeconfig"),
        "qps": 100,
        "burst": 200,
    }
    (profile,) = config["profiles"]
    assert profile["plugins"]["multiPoint"]["enabled"] == [
        {"name": "GangScheduling"},
        {"name": "TopologyPlacementGenerator"},
        {"name": "PodGroupPodsCount", "weight": 1},
    ]


def test_cache_is_outside_the_repository(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_root() == tmp_path / "gangjob"
    repo = Path(__file__).resolve().parents[2]
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert repo not in cache_root().parents


def test_oci_archive_is_a_valid_image_layout(tmp_path: Path) -> None:
    spec = images.ImageSpec(
        name="localhost/t:dev",
        files={"bin/hello": b"#!/bin/sh\necho hi\n"},
        symlinks={"bin/hi": "hello"},
        dirs=["tmp"],
        cmd=["/bin/hello"],
    )
    archive = images.write_oci_archive(spec, tmp_path / "t.tar")
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        assert {"oci-layout", "index.json"} <= names
        index = json.loads(tar.extractfile("index.json").read())  # type: ignore[union-attr]
        entry = index["manifests"][0]
        assert entry["annotations"]["io.containerd.image.name"] == "localhost/t:dev"

        def blob(digest: str) -> bytes:
            fh = tar.extractfile("blobs/sha256/" + digest.split(":")[1])
            assert fh is not None
            return fh.read()

        manifest = json.loads(blob(entry["digest"]))
        config = json.loads(blob(manifest["config"]["digest"]))
        assert config["config"]["Cmd"] == ["/bin/hello"]
        layer_bytes = io.BytesIO(blob(manifest["layers"][0]["digest"]))
        with tarfile.open(fileobj=layer_bytes) as layer:
            assert layer.getmember("bin/hi").issym()
            hello = layer.extractfile("bin/hello")
            assert hello is not None
            assert hello.read() == b"#!/bin/sh\necho hi\n"
    # Deterministic: the same spec gives the same bytes (the image is cached by content).
    again = images.write_oci_archive(spec, tmp_path / "t2.tar")
    assert again.read_bytes() == archive.read_bytes()


def test_a_run_builds_before_its_first_test_what_its_tests_run() -> None:
    unit = Path("tests/unit/test_plan.py")
    chart = Path("tests/integration/test_chart.py")
    kueue = Path("tests/integration/test_kueue.py")
    e2e = Path("tests/e2e/test_torchrun.py")
    assert prebuild.needed([unit]) == []
    assert prebuild.needed([unit, e2e]) == ["kubernetes"]
    assert prebuild.needed([kueue, chart, unit]) == ["kubernetes", "helm", "kueue"]
    assert set(prebuild.BUILDS) >= {"kubernetes", *prebuild.ADDONS.values()}


def test_up_says_when_the_user_is_short_of_inotify_instances() -> None:
    assert inotify.shortage("node", used=100, allowed=128) is None
    problem = inotify.shortage("node", used=115, allowed=128)
    assert problem is not None
    assert "13 left (115 of fs.inotify.max_user_instances=128 in use" in problem
    assert "localcluster down --name" in problem
    assert "sysctl -w fs.inotify.max_user_instances=" in problem
    assert inotify.shortage("sim", used=115, allowed=128) is None


def test_the_inotify_instances_in_use_are_counted_from_the_kernel(tmp_path: Path) -> None:
    # A /proc of this process alone: what others open meanwhile does not count here.
    (tmp_path / str(os.getpid())).symlink_to(f"/proc/{os.getpid()}")
    before = inotify.in_use(proc=tmp_path)
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(0)
    assert fd >= 0, os.strerror(ctypes.get_errno())
    try:
        assert inotify.in_use(proc=tmp_path) == before + 1
    finally:
        os.close(fd)
    assert inotify.in_use(proc=tmp_path) == before
    assert inotify.limit() > 0


def test_a_console_script_of_the_trainer_image_runs_with_the_images_python(
    tmp_path: Path,
) -> None:
    # pip --target writes the interpreter that installed it: this host's, not the image's.
    script = tmp_path / "torchrun"
    script.write_text(
        "#!/opt/build/.venv/bin/python3.11\nimport sys\nfrom torch.distributed.run import main\n"
    )
    assert pytorch.image_script(script) == (
        b"#!/usr/bin/python3\nimport sys\nfrom torch.distributed.run import main\n"
    )
