"""Data-parallel training on PyTorch's own engine (DistributedDataParallel under ``torchrun``).

``torchrun`` starts one process per rank and sets RANK / WORLD_SIZE / LOCAL_RANK; tformer reads
them, joins the process group (gloo on CPU, NCCL on CUDA) and wraps the model in DDP. Each rank
takes every ``world``-th batch of the same deterministic batch order, so rank r's share of
global step s is batch ``s * world * accumulate + ... + r``: all ranks take the same number of
steps, and the run equals a single process with ``--accumulate world * accumulate``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from tformer.errors import ConfigError


@dataclass(frozen=True)
class World:
    """This process's place in the job; a single process is rank 0 of 1."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init_world(device: torch.device) -> World:
    """Join the process group when started by torchrun; otherwise a world of one."""
    if not launched_by_torchrun():
        return World()
    world = World(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
                  int(os.environ.get("LOCAL_RANK", 0)))
    if world.world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(world.local_rank)
        # A bounded timeout turns a peer that died mid-collective into an error, not a hang.
        dist.init_process_group(backend, timeout=timedelta(minutes=5))
    return world


def local_device(device: torch.device, world: World) -> torch.device:
    """On CUDA each rank uses its own GPU (LOCAL_RANK)."""
    if device.type == "cuda" and world.distributed:
        return torch.device("cuda", world.local_rank)
    return device


def shard(batches: list[list[int]], world: World, accumulate: int) -> list[list[int]]:
    """This rank's batches of one epoch: every world-th, cut so all ranks get the same count.

    The epoch is first cut to a whole number of global steps (world * accumulate batches), so
    no rank waits at the end of an epoch for a step the others never take.
    """
    if not world.distributed:
        return batches
    per_step = world.world_size * accumulate
    usable = len(batches) - len(batches) % per_step
    if usable == 0:
        raise ConfigError(
            f"one epoch has {len(batches)} batches, fewer than {world.world_size} ranks x "
            f"--accumulate {accumulate}; lower --max-tokens or use fewer processes"
        )
    return batches[world.rank : usable : world.world_size]


def all_reduce_sum(value: float | int, device: torch.device, world: World) -> float:
    if not world.distributed:
        return float(value)
    tensor = torch.tensor([float(value)], dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return float(tensor.item())


def close(world: World) -> None:
    if world.distributed and dist.is_initialized():
        dist.destroy_process_group()


def launch(nproc: int, argv: list[str]) -> int:
    """``tformer train --nproc N ...``: re-run the same command under torchrun on this node."""
    from torch.distributed.run import main as torchrun_main

    if nproc < 1:
        raise ConfigError(f"--nproc {nproc} must be >= 1")
    args = ["--nproc-per-node", str(nproc), "--standalone", "-m", "tformer", *argv]
    try:
        torchrun_main(args)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    except Exception as error:  # torchrun raises ChildFailedError naming the failed rank
        print(f"error: {str(error).strip().splitlines()[0]}", file=sys.stderr)
        return 1
    return 0
