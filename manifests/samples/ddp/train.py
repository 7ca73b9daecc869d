"""A PyTorch DDP training program that survives a gang restart (gloo backend, CPU).

Run by every worker of a GangJob. It reads what the controller puts in its environment
(MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK) and the gang's restart epoch (GANGJOB_EPOCH in
Process mode, else the file $GANGJOB_DIR/epoch the agent writes when the barrier opens), and:

- meets its peers in a rendezvous named by the epoch: a TCPStore on rank 0 seen through the
  key prefix `gangjob/epoch-<E>/`, so a stale worker of an older epoch that still reaches rank 0
  writes under another prefix and can never be counted into the new gang;
- resumes from the latest *complete* checkpoint in CHECKPOINT_DIR, a volume all workers share
  (rank 0 writes `ckpt-<step>.pt.tmp`, then renames it: a checkpoint either exists whole or not
  at all), chosen by rank 0 and broadcast so every rank loads the same one;
- trains a tiny regression model for TRAIN_STEPS steps, checkpointing every CHECKPOINT_EVERY
  steps and logging `epoch=.. rank=.. step=.. loss=..` for each. Beside the checkpoints,
  `latest.json` tells the step, the epoch, the world size and the step this epoch resumed from;
- shards each step's global batch (GLOBAL_BATCH rows, the same whichever epoch computes it) by
  the epoch's world size: after an elastic gang's resize (docs/api.md "Elastic gangs") the
  ranks of the new world cut the same data anew and training goes on from the checkpoint;
- reports each step to GangJob with the helper the agent puts on its path (`gangjob_progress`:
  the step, this rank's own compute time in it, the last checkpoint), so that the controller
  sees a hung rank and counts what a restart cost (docs/api.md "Progress"). Outside a GangJob
  the helper is absent and nothing is reported.

Settings (env): TRAIN_STEPS (60), CHECKPOINT_EVERY (5), STEP_SECONDS (0.2: a pause per step that
stands in for real work, so a demo can be watched), GLOBAL_BATCH (96), CHECKPOINT_DIR
(/checkpoints/$GANGJOB_NAME),
RENDEZVOUS_TIMEOUT_SECONDS (120). Exits 0 when training is done. On an error, its last line goes
to the termination log (TERMINATION_LOG, /dev/termination-log) for the failure policy's
`onMessagePatterns`.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

# The progress helper the GangJob agent writes into its directory. Where the agent starts the
# trainer it is on PYTHONPATH already; where the kubelet does (Pod mode) the image's path stands.
sys.path.append(os.path.join(os.environ.get("GANGJOB_DIR", "/gangjob"), "python"))
try:
    import gangjob_progress
except ImportError:  # not run by GangJob
    gangjob_progress = None

FEATURES = 16
CHECKPOINT = re.compile(r"^ckpt-(\d{8})\.pt$")
KEEP_CHECKPOINTS = 3


def env_int(name: str, default: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        if default is None:
            sys.exit(f"train.py: {name} is not set (the GangJob controller sets it)")
        return default
    return int(raw)


def current_epoch() -> int:
    """The gang's restart epoch: Process mode passes it in the environment; in Pod mode the
    agent writes it to $GANGJOB_DIR/epoch before the trainer may start."""
    if os.environ.get("GANGJOB_EPOCH"):
        return int(os.environ["GANGJOB_EPOCH"])
    path = Path(os.environ.get("GANGJOB_DIR", "/gangjob")) / "epoch"
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return 0  # not run by GangJob: a single epoch


def log(epoch: int, rank: int, msg: str) -> None:
    stamp = datetime.datetime.now(datetime.UTC).strftime("%H:%M:%S.%f")[:-3]
    print(f"{stamp} epoch={epoch} rank={rank} {msg}", flush=True)


def rendezvous(epoch: int, rank: int, world_size: int, timeout: float) -> None:
    """init_process_group through a store whose keys are prefixed by the epoch."""
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        env_int("MASTER_PORT"),
        world_size,
        is_master=rank == 0,
        timeout=datetime.timedelta(seconds=timeout),
    )
    scoped = dist.PrefixStore(f"gangjob/epoch-{epoch}/", store)
    dist.init_process_group(
        "gloo",
        store=scoped,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout),
    )


def latest_checkpoint(directory: Path) -> int:
    """The step of the newest complete checkpoint, 0 if none (a `.tmp` is never complete)."""
    steps = [int(m.group(1)) for p in directory.iterdir() if (m := CHECKPOINT.match(p.name))]
    return max(steps, default=0)


def save_checkpoint(
    directory: Path,
    step: int,
    epoch: int,
    resumed_from: int,
    world_size: int,
    model: nn.Module,
    opt: MomentumSGD,
) -> None:
    final = directory / f"ckpt-{step:08d}.pt"
    tmp = final.with_name(final.name + ".tmp")
    torch.save(
        {
            "step": step,
            "epoch": epoch,
            "resumed_from": resumed_from,
            "world_size": world_size,
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
        },
        tmp,
    )
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, final)  # atomic: readers see the whole file or none
    # A small summary beside it, for people and tests that have no torch to read a checkpoint.
    summary = {
        "step": step,
        "epoch": epoch,
        "resumed_from": resumed_from,
        "world_size": world_size,
        "time": time.time(),
    }
    tmp_json = directory / "latest.json.tmp"
    tmp_json.write_text(json.dumps(summary) + "\n")
    os.replace(tmp_json, directory / "latest.json")
    for old in sorted(p for p in directory.iterdir() if CHECKPOINT.match(p.name))[
        :-KEEP_CHECKPOINTS
    ]:
        old.unlink(missing_ok=True)


class MomentumSGD:
    """SGD with momentum and a state_dict, like torch.optim.SGD. Not torch.optim itself: its
    first use imports torch._dynamo, seconds of CPU that every restart would pay again."""

    def __init__(self, params: list[torch.Tensor], lr: float, momentum: float) -> None:
        self.params, self.lr, self.momentum = params, lr, momentum
        self.buffers = [torch.zeros_like(p) for p in params]

    @torch.no_grad()
    def step(self) -> None:
        for p, buf in zip(self.params, self.buffers, strict=True):
            if p.grad is not None:
                buf.mul_(self.momentum).add_(p.grad)
                p.add_(buf, alpha=-self.lr)
                p.grad = None

    def state_dict(self) -> dict[str, object]:
        return {"lr": self.lr, "momentum": self.momentum, "buffers": self.buffers}

    def load_state_dict(self, state: dict[str, object]) -> None:
        for buf, saved in zip(self.buffers, state["buffers"], strict=True):
            buf.copy_(saved)


def batch(
    step: int, rank: int, world_size: int, rows: int, true_w: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's shard of the step's global batch: synthetic data, the same for a step
    whichever epoch and world size compute it, cut into `world_size` shards (every
    world_size-th row from `rank`), as a sampler shards a dataset by the world of the run."""
    gen = torch.Generator().manual_seed(step)
    x = torch.randn(rows, FEATURES, generator=gen)
    y = x @ true_w + 0.01 * torch.randn(rows, 1, generator=gen)
    return x[rank::world_size], y[rank::world_size]


def main() -> int:
    rank, world_size = env_int("RANK"), env_int("WORLD_SIZE")
    epoch = current_epoch()
    steps = env_int("TRAIN_STEPS", 60)
    every = env_int("CHECKPOINT_EVERY", 5)
    pause = float(os.environ.get("STEP_SECONDS", "0.2"))
    rows = env_int("GLOBAL_BATCH", 96)
    job = os.environ.get("GANGJOB_NAME", "ddp")
    ckpt_dir = Path(os.environ.get("CHECKPOINT_DIR", f"/checkpoints/{job}"))
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)

    t0 = time.monotonic()
    log(epoch, rank, f"rendezvous at {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} "
        f"as {rank}/{world_size}, prefix gangjob/epoch-{epoch}/")  # fmt: skip
    rendezvous(epoch, rank, world_size, float(os.environ.get("RENDEZVOUS_TIMEOUT_SECONDS", "120")))
    log(epoch, rank, f"gang formed in {time.monotonic() - t0:.2f}s")

    torch.manual_seed(0)
    model = nn.Linear(FEATURES, 1)
    opt = MomentumSGD(list(model.parameters()), lr=0.05, momentum=0.9)
    # Rank 0 picks the checkpoint, so that every rank loads the same one.
    pick = torch.tensor([latest_checkpoint(ckpt_dir) if rank == 0 else 0])
    dist.broadcast(pick, src=0)
    start = int(pick.item())
    if start:
        state = torch.load(ckpt_dir / f"ckpt-{start:08d}.pt", weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        written = f"written at epoch {state['epoch']}, world size {state.get('world_size', '?')}"
        log(epoch, rank, f"resumed from checkpoint step={start} ({written})")
    else:
        log(epoch, rank, "no checkpoint: starting at step=0")
    ddp = DistributedDataParallel(model)
    true_w = torch.arange(FEATURES, dtype=torch.float32).unsqueeze(1) / FEATURES

    checkpointed = start
    for step in range(start + 1, steps + 1):
        began = time.perf_counter()
        x, y = batch(step, rank, world_size, rows, true_w)
        loss = nn.functional.mse_loss(ddp(x), y)
        time.sleep(pause)  # stands in for the real work of a step
        compute = time.perf_counter() - began  # this rank's own work, before the all-reduce
        loss.backward()  # gradients are all-reduced over gloo here
        opt.step()
        log(epoch, rank, f"step={step} loss={loss.item():.5f}")
        if step % every == 0 or step == steps:
            if rank == 0:
                save_checkpoint(ckpt_dir, step, epoch, start, world_size, model, opt)
                log(epoch, rank, f"checkpoint step={step}")
            dist.barrier()  # no rank runs ahead of a checkpoint it might need to resume from
            checkpointed = step
        if gangjob_progress is not None:
            gangjob_progress.step(step, compute=compute, checkpoint=checkpointed)

    log(epoch, rank, f"training done at step={steps}")
    dist.destroy_process_group()
    return 0


def run() -> int:
    """main(), and on an uncaught error its last line (`RuntimeError: ... Connection closed by
    peer`, `CUDA error: ...`) written to the termination log, where the kubelet reads it into
    the container's status for the GangJob's `onMessagePatterns` rules; exit 1."""
    try:
        return main()
    except Exception as error:
        detail = f"{type(error).__name__}: {error}"
        with contextlib.suppress(OSError):
            Path(os.environ.get("TERMINATION_LOG", "/dev/termination-log")).write_text(
                detail[-4096:]  # the kubelet keeps at most 4096 bytes
            )
        raise


if __name__ == "__main__":
    sys.exit(run())
