"""A PyTorch DDP program launched by torchrun (gloo, CPU) that survives a gang restart.

`torchrun train.py` in every worker pod: the GangJob controller gives torchrun its settings as
PET_* variables (a pod is one torchrun node, PET_NPROC_PER_NODE processes each) and the agent
gives it the epoch's rendezvous id (PET_RDZV_ID) and GANGJOB_EPOCH. torchrun then starts this
program once per local process with RANK, WORLD_SIZE, LOCAL_RANK and the rendezvous store, so the
program itself only calls `init_process_group("gloo")`.

It resumes from the latest complete checkpoint in CHECKPOINT_DIR (a volume every pod shares;
global rank 0 writes `ckpt-<step>.pt.tmp` and renames it, picks the one to resume from and
broadcasts it), trains a tiny regression model for TRAIN_STEPS steps, checkpointing every
CHECKPOINT_EVERY, and logs `epoch=.. rank=.. step=.. loss=..`. Beside the checkpoints,
`latest.json` tells the step, the epoch, the world size and the step this epoch resumed from.

Settings (env): TRAIN_STEPS (60), CHECKPOINT_EVERY (5), STEP_SECONDS (0.2),
CHECKPOINT_DIR (/checkpoints/$GANGJOB_NAME).
"""

from __future__ import annotations

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

# The progress helper the GangJob agent writes into its directory (docs/api.md "Progress"): each
# of torchrun's local processes reports its own steps (the helper writes one file per
# LOCAL_RANK); the worker is as far as its slowest process.
sys.path.append(os.path.join(os.environ.get("GANGJOB_DIR", "/gangjob"), "python"))
try:
    import gangjob_progress
except ImportError:  # not run by GangJob
    gangjob_progress = None

FEATURES = 16
BATCH = 32
CHECKPOINT = re.compile(r"^ckpt-(\d{8})\.pt$")
KEEP_CHECKPOINTS = 3
LR = 0.05


def log(epoch: int, rank: int, msg: str) -> None:
    stamp = datetime.datetime.now(datetime.UTC).strftime("%H:%M:%S.%f")[:-3]
    print(f"{stamp} epoch={epoch} rank={rank} {msg}", flush=True)


def latest_checkpoint(directory: Path) -> int:
    steps = [int(m.group(1)) for p in directory.iterdir() if (m := CHECKPOINT.match(p.name))]
    return max(steps, default=0)


def save_checkpoint(
    directory: Path, step: int, summary: dict[str, object], state: dict[str, object]
) -> None:
    final = directory / f"ckpt-{step:08d}.pt"
    tmp = final.with_name(final.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, final)  # atomic: readers see the whole file or none
    tmp_json = directory / "latest.json.tmp"
    tmp_json.write_text(json.dumps({"step": step, **summary, "time": time.time()}) + "\n")
    os.replace(tmp_json, directory / "latest.json")
    for old in sorted(p for p in directory.iterdir() if CHECKPOINT.match(p.name))[
        :-KEEP_CHECKPOINTS
    ]:
        old.unlink(missing_ok=True)


def batch(step: int, rank: int, true_w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic data, the same for a (step, rank) whichever epoch computes it."""
    gen = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(BATCH, FEATURES, generator=gen)
    y = x @ true_w + 0.01 * torch.randn(BATCH, 1, generator=gen)
    return x, y


def main() -> int:
    # Set by torchrun for each of its processes.
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank, node_rank = int(os.environ["LOCAL_RANK"]), int(os.environ["GROUP_RANK"])
    # Set by the GangJob agent where it started torchrun; 0 when run by hand.
    epoch = int(os.environ.get("GANGJOB_EPOCH", "0"))
    steps = int(os.environ.get("TRAIN_STEPS", "60"))
    every = int(os.environ.get("CHECKPOINT_EVERY", "5"))
    pause = float(os.environ.get("STEP_SECONDS", "0.2"))
    job = os.environ.get("GANGJOB_NAME", "torchrun")
    ckpt_dir = Path(os.environ.get("CHECKPOINT_DIR", f"/checkpoints/{job}"))
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)

    # torchrun's rendezvous store, keyed by its run id (PET_RDZV_ID), which names the epoch.
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    log(epoch, rank, f"world={world} node_rank={node_rank} local_rank={local_rank} "
        f"run_id={os.environ.get('TORCHELASTIC_RUN_ID')} pid={os.getpid()}")  # fmt: skip

    torch.manual_seed(0)
    model = nn.Linear(FEATURES, 1)
    pick = torch.tensor([latest_checkpoint(ckpt_dir) if rank == 0 else 0])
    dist.broadcast(pick, src=0)
    start = int(pick.item())
    if start:
        state = torch.load(ckpt_dir / f"ckpt-{start:08d}.pt", weights_only=True)
        model.load_state_dict(state["model"])
        written = state["epoch"]
        log(epoch, rank, f"resumed from checkpoint step={start} (written at epoch {written})")
    else:
        log(epoch, rank, "no checkpoint: starting at step=0")
    ddp = DistributedDataParallel(model)
    true_w = torch.arange(FEATURES, dtype=torch.float32).unsqueeze(1) / FEATURES

    checkpointed = start
    for step in range(start + 1, steps + 1):
        began = time.perf_counter()
        x, y = batch(step, rank, true_w)
        loss = nn.functional.mse_loss(ddp(x), y)
        compute = time.perf_counter() - began  # this process's own work, before the all-reduce
        loss.backward()  # gradients are all-reduced over gloo here
        # Plain SGD by hand: torch.optim's first use imports torch._dynamo, seconds of CPU that
        # every restart would pay again.
        with torch.no_grad():
            for p in model.parameters():
                p -= LR * p.grad
                p.grad = None
        log(epoch, rank, f"step={step} loss={loss.item():.5f}")
        if step % every == 0 or step == steps:
            if rank == 0:
                state = {"epoch": epoch, "model": model.state_dict()}
                summary = {"epoch": epoch, "world": world, "resumed_from": start}
                save_checkpoint(ckpt_dir, step, summary, state)
                log(epoch, rank, f"checkpoint step={step}")
            dist.barrier()  # no rank runs ahead of a checkpoint it might need to resume from
            checkpointed = step
        if gangjob_progress is not None:
            gangjob_progress.step(step, compute=compute, checkpoint=checkpointed)
        time.sleep(pause)

    log(epoch, rank, f"training done at step={steps}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
