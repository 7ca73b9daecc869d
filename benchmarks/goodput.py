"""Goodput as GangJob reports it against the truth from the trainers' own logs, on a REAL node.

    python -m benchmarks.goodput [--steps 400] [--pace 0.5] [--cluster node] [--keep]

One `Process`-mode gang of 3 Python trainers on a local cluster of the `node` profile (started if
it is not up) trains `--steps` steps on a common grid of `--pace` seconds, checkpointing every
`--every` steps to a directory all workers share, reporting each step and its checkpoint through
the `gangjob_progress` helper, and resuming from the checkpoint at each epoch. Restarts of
several classes: rank 1 exits 1 at a quarter of the steps (`ProcessExit`), rank 2 stops
reporting, alive, at half of them (`Hang`), then the gang trains to the end and succeeds.

Each trainer logs every step with its time. The truth, from rank 0's log: productive time is,
for each epoch, the time from its start until it had computed the steps the next epoch kept
(up to the checkpoint that epoch resumed from; the last epoch, to the end); wall time is the
job's (`status.startTime` to `completionTime`, as GangJob counts it); a restart's lost steps are
the gang's step when it failed (the lowest last step of the ranks at that epoch) less the step
the next epoch resumed from. Printed beside `status.goodput` and each record's `lostSteps`, with
the goals: goodput within 1 percentage point, lost steps within 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from api import builders
from benchmarks.common import Progress, markdown_table, until_terminated, write_json
from benchmarks.realnode import controller_on_node, record_restarts, watch_until
from controller.k8s import JsonDict, Kube
from localcluster.node import AGENT_IMAGE
from localcluster.tools import kubectl

HANG_SECONDS = 5
CHECKPOINTS = Path("/var/tmp/gangjob-goodput")

TRAINER = r"""
import json, os, sys, time
sys.path.insert(0, os.path.join(os.environ["GANGJOB_DIR"], "python"))
import gangjob_progress

rank, epoch = int(os.environ["RANK"]), int(os.environ["GANGJOB_EPOCH"])
world = int(os.environ["WORLD_SIZE"])
steps, every, pace = int(os.environ["STEPS"]), int(os.environ["EVERY"]), float(os.environ["PACE"])
# Between two checkpoints, so that each restart loses steps.
crash_at, hang_at = steps // 4 + every // 2, steps // 2 + every // 3
path = "/ckpt/step"


def log(**fields):
    print(json.dumps({"t": time.time(), "epoch": epoch, "rank": rank, **fields}), flush=True)


def done(step):
    with open(f"/ckpt/e{epoch}-rank{rank}.tmp", "w") as f:
        f.write(str(step))
    os.replace(f"/ckpt/e{epoch}-rank{rank}.tmp", f"/ckpt/e{epoch}-rank{rank}")


def after_peers(step):
    # A synchronous gang: no rank starts a step before every rank has finished the one before
    # (the all-reduce), so a hung rank holds every other one, as it does in DDP.
    while True:
        try:
            if min(int(open(f"/ckpt/e{epoch}-rank{r}").read()) for r in range(world)) >= step:
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.01)


try:
    start = int(open(path).read())
except (OSError, ValueError):
    start = 0
log(event="start", step=start)
done(start)
began, step = time.time(), start
while step < steps:
    after_peers(step)
    # Steps on a common grid from the epoch's start.
    time.sleep(max(0.0, began + (step + 1 - start) * pace - time.time()))
    step += 1
    if rank == 0 and step % every == 0:
        with open(path + ".tmp", "w") as f:
            f.write(str(step))
        os.replace(path + ".tmp", path)
    gangjob_progress.step(step, checkpoint=step // every * every)
    log(event="step", step=step)
    done(step)
    if epoch == 0 and rank == 1 and step == crash_at:
        log(event="crash")
        sys.exit(1)
    if epoch == 1 and rank == 2 and step == hang_at:
        log(event="hang")
        while True:
            time.sleep(1)
log(event="done")
"""


def gangjob(name: str, steps: int, every: int, pace: float, checkpoints: Path) -> JsonDict:
    env = {"STEPS": str(steps), "EVERY": str(every), "PACE": str(pace)}
    return builders.gangjob(
        name, 3,
        image=AGENT_IMAGE, command=["python3", "-c", TRAINER],
        container={
            "imagePullPolicy": "Never",
            "env": [{"name": k, "value": v} for k, v in env.items()],
            "volumeMounts": [{"name": "ckpt", "mountPath": "/ckpt"}],
        },
        pod_spec={
            "terminationGracePeriodSeconds": 5,
            "volumes": [{"name": "ckpt", "hostPath": {"path": str(checkpoints),
                                                        "type": "DirectoryOrCreate"}}],
        },
        restart_mode="Process",
        spec={"progress": {"hangSeconds": HANG_SECONDS}},
    )  # fmt: skip


def _time(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def truth(logs: dict[int, list[JsonDict]], steps: int) -> tuple[float, dict[int, int]]:
    """(productive seconds, lost steps by the epoch restarted to) from the trainers' logs."""
    starts: dict[int, tuple[float, int]] = {}
    step_time: dict[tuple[int, int], float] = {}
    last_step: dict[tuple[int, int], int] = {}
    for rank, lines in logs.items():
        for line in lines:
            epoch = line["epoch"]
            if line["event"] == "start" and rank == 0:
                starts[epoch] = (line["t"], line["step"])
            if line["event"] == "step":
                if rank == 0:
                    step_time[(epoch, line["step"])] = line["t"]
                last_step[(epoch, rank)] = max(last_step.get((epoch, rank), 0), line["step"])
    epochs = sorted(starts)
    productive = 0.0
    lost: dict[int, int] = {}
    for i, epoch in enumerate(epochs):
        began, _ = starts[epoch]
        kept_to = starts[epochs[i + 1]][1] if i + 1 < len(epochs) else steps
        if kept_to > starts[epoch][1]:
            productive += step_time[(epoch, kept_to)] - began
        if i + 1 < len(epochs):
            reached = min(s for (e, _), s in last_step.items() if e == epoch)
            lost[epochs[i + 1]] = reached - kept_to
    return productive, lost


async def run(args: argparse.Namespace) -> int:
    ns = f"bench-goodput-{int(time.time())}"
    checkpoints = CHECKPOINTS / ns
    name = "goodput"
    records: dict[int, JsonDict] = {}
    # Progress reaches the controller over the direct arrival channel, on the pod bridge.
    stage = controller_on_node(
        args.cluster, "bench-goodput-controller.log", arrivals=True, keep=args.keep
    )
    with stage as (cluster, _):
        async with await Kube.from_kubeconfig(cluster.kubeconfig) as kube:
            kubectl(cluster, "create", "namespace", ns)
            body = gangjob(name, args.steps, args.every, args.pace, checkpoints)
            kubectl(cluster, "-n", ns, "apply", "-f", "-", stdin=yaml.safe_dump(body))
            progress = Progress("goodput job")

            def done(job: JsonDict) -> bool:
                record_restarts(job, records)
                st = job.get("status", {})
                step = (st.get("progress") or {}).get("step")
                progress.tick(f"epoch {st.get('epoch', 0)}, step {step}")
                if st.get("phase") == "Failed":
                    raise RuntimeError(f"job failed: {st.get('conditions')}")
                return bool(st.get("phase") == "Succeeded")

            timeout = 120 + 3 * args.steps * args.pace
            job = await watch_until(kube, ns, name, done, timeout)
            logs: dict[int, list[JsonDict]] = {}
            for rank in range(3):
                out = kubectl(cluster, "-n", ns, "logs", f"{name}-{rank}", "-c", "trainer")
                logs[rank] = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
            kubectl(cluster, "delete", "namespace", ns, "--wait=false")
    st = job["status"]
    wall = _time(st["completionTime"]) - _time(st["startTime"])
    productive, lost = truth(logs, args.steps)
    goodput = st["goodput"]
    true_ratio = productive / wall
    error_pp = 100 * abs(goodput["ratio"] - true_ratio)
    rows: list[list[Any]] = [
        ["goodput (%)", f"{100 * goodput['ratio']:.2f}", f"{100 * true_ratio:.2f}",
         f"{error_pp:.2f} pp", "met" if error_pp <= 1 else "not met"],
        ["wall (s)", goodput["wallSeconds"], round(wall, 1), "", ""],
        ["productive (s)", goodput["productiveSeconds"], round(productive, 1), "", ""],
    ]  # fmt: skip
    for epoch, record in sorted(records.items()):
        reported, true = record.get("lostSteps"), lost.get(epoch)
        miss = None if reported is None or true is None else abs(reported - true)
        rows.append([
            f"lost steps, restart to epoch {epoch} ({record['trigger']['class']})",
            reported, true, "-" if miss is None else miss,
            "met" if miss is not None and miss <= 1 else "not met",
        ])  # fmt: skip
    table = markdown_table(["figure", "GangJob", "truth (logs)", "error", "goal"], rows)
    path = write_json(
        "goodput",
        {"steps": args.steps, "pace": args.pace, "every": args.every, "status": st,
         "truth": {"productive_s": productive, "wall_s": wall, "lost_steps": lost}},
    )  # fmt: skip
    print(
        f"\nGoodput of a {args.steps}-step gang ({args.pace} s a step, checkpoint every "
        f"{args.every}) with a crash and a hang, GangJob against its trainers' logs "
        f"(lost by cause: {goodput['lostSeconds']}):\n\n{table}\n\nresults: {path}"
    )
    return 0


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.goodput", description=__doc__)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--pace", type=float, default=0.5, help="seconds a step")
    p.add_argument("--every", type=int, default=20, help="steps between checkpoints")
    p.add_argument("--cluster", default="node", help="local cluster (node profile)")
    p.add_argument("--keep", action="store_true", help="leave the cluster up afterwards")
    return asyncio.run(until_terminated(run(p.parse_args())))


if __name__ == "__main__":
    sys.exit(main())
