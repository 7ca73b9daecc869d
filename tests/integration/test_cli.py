"""`gangjob`, the command line, against the real apiserver: submit from flags and from a file,
status, list, report, a manual restart honoured by the controller, delete; `kubectl gangjob` as
a kubectl plugin; and the Python client the command line is built on. Run as the user runs it: the
installed console script, with a kubeconfig (its logs are tested on the real kubelet, in
tests/e2e/test_cli_logs.py)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
import yaml

from api import builders
from api.constants import ANNOTATION_RESTART
from controller.k8s import CONFIGMAPS, GANGJOBS, Kube, NotFound
from gangjob import Client, Job
from localcluster.cluster import SIMULATED_KUBELET_LABEL, Cluster
from localcluster.versions import binary
from tests.integration import test_restart
from tests.integration.harness import gang_pods
from tests.integration.test_restart import Gang
from tests.waiting import wait_gone

pytestmark = pytest.mark.integration

GANGJOB = Path(sys.executable).with_name("gangjob")

# The sim gang of test_restart (its nodes, the controller, the simulated kubelet and agents).
gang = test_restart.gang
ctl_kubeconfig = test_restart.ctl_kubeconfig


async def gangjob(kubeconfig: Path, *args: str) -> tuple[int, str, str]:
    """Runs the console script; (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        str(GANGJOB), *args[:1], "--kubeconfig", str(kubeconfig), *args[1:],
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_submit_from_flags_makes_the_gangjob_the_builder_makes(
    sim_kube: Kube, sim_cluster: Cluster, gang: Gang, tmp_path: Path
) -> None:
    program = tmp_path / "train.py"
    program.write_text("print('hello')\n")
    code, out, err = await gangjob(
        sim_cluster.kubeconfig, "submit", "-n", gang.ns, "--image", "my/trainer:1",
        "--workers", "2", "--processes", "auto", "--gpus", "2", "--mode", "Process",
        "--env", "EPOCHS=3", "--program", str(program), "--checkpoints", "/var/tmp/ck",
        "--", "torchrun", "train.py", "--lr", "0.1",
    )  # fmt: skip
    assert code == 0, err
    name = out.strip()
    assert name.startswith("train-")
    job = await sim_kube.get(GANGJOBS, name, gang.ns)
    gpus = {"nvidia.com/gpu": "2"}
    expected = builders.gangjob(
        name, 2, namespace=gang.ns, image="my/trainer:1",
        command=["torchrun", "train.py", "--lr", "0.1"],
        container={
            "env": [{"name": "EPOCHS", "value": "3"}],
            "resources": {"limits": gpus, "requests": gpus},
            "workingDir": "/program",
            "volumeMounts": [
                {"name": "program", "mountPath": "/program", "readOnly": True},
                {"name": "checkpoints", "mountPath": "/checkpoints"},
            ],
        },
        pod_spec={
            "volumes": [
                {"name": "program", "configMap": {"name": f"{name}-program"}},
                {"name": "checkpoints",
                 "hostPath": {"path": "/var/tmp/ck", "type": "DirectoryOrCreate"}},
            ]
        },
        restart_mode="Process", spec={"nprocPerNode": "auto"},
    )  # fmt: skip
    # What the user would have written, with the apiserver's defaults filled in.
    assert job["spec"]["template"] == expected["spec"]["template"]
    assert job["spec"]["nprocPerNode"] == "auto"
    assert job["spec"]["restart"]["mode"] == "Process"
    assert job["spec"]["replicas"] == 2
    # The program, in a ConfigMap the job owns (deleted with it).
    configmap = await sim_kube.get(CONFIGMAPS, f"{name}-program", gang.ns)
    assert configmap["data"] == {"train.py": "print('hello')\n"}
    (owner,) = configmap["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("GangJob", name, job["metadata"]["uid"])


async def test_submit_refuses_what_it_cannot_run_naming_the_flag(
    sim_cluster: Cluster, gang: Gang, tmp_path: Path
) -> None:
    code, _, err = await gangjob(sim_cluster.kubeconfig, "submit", "-n", gang.ns, "--", "x")
    assert code == 2
    assert "--image" in err
    code, _, err = await gangjob(
        sim_cluster.kubeconfig, "submit", "-n", gang.ns, "--image", "i", "--workers", "1",
        "--processes", "0", "--", "x",
    )  # fmt: skip
    assert code == 2
    assert "--processes" in err
    code, _, err = await gangjob(
        sim_cluster.kubeconfig, "submit", "-n", gang.ns, "--image", "i", "--workers", "1",
        "--checkpoints", "relative/dir", "--", "x",
    )  # fmt: skip
    assert code == 2
    assert "--checkpoints relative/dir" in err
    # The apiserver's own refusal reaches the user with the field it names.
    bad = builders.gangjob("bad", 1, image="i", command=["x"], spec={"nprocPerNode": "all"})
    manifest = tmp_path / "bad.yaml"
    manifest.write_text(yaml.safe_dump(bad))
    code, _, err = await gangjob(
        sim_cluster.kubeconfig, "submit", "-n", gang.ns, "-f", str(manifest)
    )
    assert code == 1
    assert "nprocPerNode" in err


async def test_status_restart_and_delete(
    sim_kube: Kube, sim_cluster: Cluster, gang: Gang, tmp_path: Path
) -> None:
    # A job the simulated kubelet runs (its nodes, its label), given as a file.
    body = builders.gangjob(
        "cli", 3, image="localhost/busybox:dev", command=["sh", "-c", "sleep infinity"],
        pod_spec={"nodeSelector": {"gangjob-test": gang.ns}},
        pod_labels={SIMULATED_KUBELET_LABEL: "true"},
    )  # fmt: skip
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump(body))
    kubeconfig = sim_cluster.kubeconfig

    code, out, err = await gangjob(kubeconfig, "submit", "-n", gang.ns, "-f", str(manifest))
    assert (code, out.strip()) == (0, "cli"), err
    await gang.running_at("cli", 0, 3)
    pods = {
        p["metadata"]["name"]: p["metadata"]["uid"]
        for p in await gang_pods(sim_kube, gang.ns, "cli")
    }

    code, out, err = await gangjob(kubeconfig, "status", "-n", gang.ns, "cli")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == [
        "NAME",
        "PHASE",
        "EPOCH",
        "BARRIER",
        "READY",
        "ARRIVED",
        "WORKERS",
        "MODE",
    ]
    assert lines[1].split()[:4] == ["cli", "Running", "0", "0"]
    assert lines[1].split()[5:7] == ["3/3", "3/3"]
    assert "Restarts: 0" in out

    code, out, err = await gangjob(kubeconfig, "restart", "-n", gang.ns, "cli", "--wait")
    assert code == 0, err
    assert "gang restart requested at epoch 0" in out
    assert "running at epoch 1" in out
    job = await sim_kube.get(GANGJOBS, "cli", gang.ns)
    assert job["metadata"]["annotations"][ANNOTATION_RESTART] == "0"
    st = job["status"]
    assert (st["epoch"], st["barrierEpoch"]) == (1, 1)
    assert st["restarts"]["total"] == 1
    assert st["restarts"]["counted"] == 0
    last = st["lastRestart"]
    assert last["trigger"]["class"] == "ManualRestart"
    assert "worker" not in last["trigger"]
    assert last["durationSeconds"] >= 0
    # In place: the same pods.
    after = {
        p["metadata"]["name"]: p["metadata"]["uid"]
        for p in await gang_pods(sim_kube, gang.ns, "cli")
    }
    assert after == pods

    code, out, err = await gangjob(kubeconfig, "status", "-n", gang.ns, "cli")
    assert code == 0, err
    lines = out.splitlines()
    restarts = next(i for i, line in enumerate(lines) if line.startswith("Restarts:"))
    history = lines[restarts + 1 :]
    assert history[0].split()[:2] == ["EPOCH", "TRIGGER"]
    row = history[1].split()
    assert row[:4] == ["1", "gang", "ManualRestart", "RestartGang"]
    assert row[5] == f"{last['durationSeconds']:.2f}s"

    code, out, err = await gangjob(kubeconfig, "delete", "-n", gang.ns, "cli")
    assert (code, out.strip()) == (0, "cli: deleted"), err
    await wait_gone(sim_kube, GANGJOBS, "cli", gang.ns, timeout=60)
    code, _, err = await gangjob(kubeconfig, "status", "-n", gang.ns, "cli")
    assert code == 1
    assert "not found" in err
    with pytest.raises(NotFound):
        await sim_kube.get(GANGJOBS, "cli", gang.ns)


async def test_list_report_and_the_kubectl_plugin(
    sim_kube: Kube, sim_cluster: Cluster, gang: Gang, tmp_path: Path
) -> None:
    body = builders.gangjob(
        "seen", 2, image="localhost/busybox:dev", command=["sh", "-c", "sleep infinity"],
        pod_spec={"nodeSelector": {"gangjob-test": gang.ns}},
        pod_labels={SIMULATED_KUBELET_LABEL: "true"},
    )  # fmt: skip
    await sim_kube.create(GANGJOBS, body, gang.ns)
    await gang.running_at("seen", 0, 2)
    kubeconfig = sim_cluster.kubeconfig

    code, out, err = await gangjob(kubeconfig, "list", "-n", gang.ns)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == [
        "NAME", "PHASE", "READY", "EPOCH", "RESTARTS", "STEP", "GOODPUT", "AGE",
    ]  # fmt: skip
    row = next(line.split() for line in lines[1:] if line.startswith("seen "))
    # No progress reports: no step. (Goodput counts from the start, scheduling included.)
    assert row[:6] == ["seen", "Running", "2/2", "0", "0", "-"]
    assert len(row) == 8
    code, out, err = await gangjob(kubeconfig, "list", "-A", "-o", "name")
    assert code == 0, err
    assert "gangjob.gangjob.io/seen" in out.splitlines()

    picture = tmp_path / "seen.png"
    code, out, err = await gangjob(kubeconfig, "report", "-n", gang.ns, "seen", "-o", str(picture))
    assert (code, out.strip()) == (0, str(picture)), err
    assert picture.read_bytes().startswith(b"\x89PNG")

    # `kubectl gangjob`: the pinned kubectl finds the plugin on the PATH and runs it.
    plugin = await asyncio.create_subprocess_exec(
        str(binary("kubectl").path), "gangjob", "status", "--kubeconfig", str(kubeconfig),
        "-n", gang.ns, "seen",
        env={"PATH": f"{GANGJOB.parent}:/usr/bin:/bin", "HOME": str(tmp_path)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out_b, err_b = await asyncio.wait_for(plugin.communicate(), 60)
    assert plugin.returncode == 0, err_b.decode()
    assert out_b.decode().splitlines()[1].split()[:4] == ["seen", "Running", "0", "0"]
    await sim_kube.delete(GANGJOBS, "seen", gang.ns)


async def test_the_python_client_against_the_apiserver(
    sim_kube: Kube, sim_cluster: Cluster, gang: Gang
) -> None:
    """Client: create, get, list, restart and wait for the barrier, delete; typed results."""
    body = builders.gangjob(
        "py", 2, image="localhost/busybox:dev", command=["sh", "-c", "sleep infinity"],
        pod_spec={"nodeSelector": {"gangjob-test": gang.ns}},
        pod_labels={SIMULATED_KUBELET_LABEL: "true"},
    )  # fmt: skip

    def use_it() -> tuple[Job, Job, list[str], Job]:
        with Client(sim_cluster.kubeconfig, namespace=gang.ns) as client:
            created = client.create(body)
            running = client.wait("py", until=lambda j: j.workers_ready == 2, timeout=60)
            names = [j.name for j in client.list()]
            restarted = client.restart("py", wait=True, timeout=60)
            client.delete("py")
            return created, running, names, restarted

    created, running, names, restarted = await asyncio.to_thread(use_it)
    assert (created.name, created.namespace, created.phase) == ("py", gang.ns, "Pending")
    assert (running.phase, running.epoch, running.workers) == ("Running", 0, 2)
    assert "py" in names
    assert restarted.resource.status.barrier_epoch == 1
    assert restarted.restarts == 1
    assert restarted.history[-1].trigger.failure_class == "ManualRestart"
    await wait_gone(sim_kube, GANGJOBS, "py", gang.ns, timeout=60)


async def test_scale_resizes_an_elastic_gang_in_place(
    sim_kube: Kube, sim_cluster: Cluster, gang: Gang
) -> None:
    await gang.create("sc", 3, restart={"mode": "Process"},
                      elastic={"minReplicas": 2, "maxReplicas": 4})  # fmt: skip
    await gang.running_at("sc", 0, 3)
    kubeconfig = sim_cluster.kubeconfig
    code, out, err = await gangjob(kubeconfig, "scale", "-n", gang.ns, "sc", "--replicas", "2",
                                   "--wait")  # fmt: skip
    assert code == 0, err
    assert "sc: replicas set to 2" in out
    assert "sc: running 2 workers at epoch 1" in out
    job = await sim_kube.get(GANGJOBS, "sc", gang.ns)
    assert (job["status"]["worldSize"], job["status"]["barrierEpoch"]) == (2, 1)
    # Out of bounds, and a job that is not elastic: refused, naming why.
    code, _, err = await gangjob(kubeconfig, "scale", "-n", gang.ns, "sc", "--replicas", "5")
    assert code == 2
    assert "--replicas 5: must be within spec.elastic.minReplicas..maxReplicas (2..4)" in err
    await gang.create("fixed", 1)
    code, _, err = await gangjob(kubeconfig, "scale", "-n", gang.ns, "fixed", "--replicas", "2")
    assert code == 2
    assert "neither spec.elastic nor spec.roles[].elastic is set" in err
