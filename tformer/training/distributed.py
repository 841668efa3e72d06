"""Data-parallel training on PyTorch's own engine (DistributedDataParallel under ``torchrun``).

``torchrun`` starts one process per rank and sets RANK / WORLD_SIZE / LOCAL_RANK; tformer reads
them, joins the process group (gloo on CPU, NCCL on CUDA) and wraps the model in DDP. Each rank
takes every ``world``-th batch of the same deterministic batch order: one optimizer step uses
``world * accumulate`` consecutive batches and rank r computes batches r, r + world, ... of
them. All ranks therefore take the same number of steps (the order runs on across epochs, so
no rank waits at an epoch's end), and the run equals a single process with
``--accumulate world * accumulate``.
"""

from __future__ import annotations

import inspect
import os
import signal
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from tformer.errors import ConfigError, DeviceError

if TYPE_CHECKING:
    from tformer.model import TransformerBase


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
    world = World(
        int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
    )
    if world.world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            local = int(os.environ.get("LOCAL_WORLD_SIZE", world.world_size))
            check_gpus_per_process(device, local, option="torchrun --nproc-per-node")
            torch.cuda.set_device(world.local_rank)
        # A bounded timeout turns a peer that hangs mid-collective into an error; a peer that
        # dies is caught sooner by torchrun, which then stops the whole job. Generous enough
        # for rank 0's validation (translating the validation subset) while others wait.
        dist.init_process_group(backend, timeout=timedelta(minutes=30))
    return world


def check_gpus_per_process(device: torch.device, processes: int, option: str = "--nproc") -> None:
    """On CUDA every data-parallel process needs a GPU of its own (NCCL cannot share one).

    ``option`` is what the user set the number of processes with, for the message.

    Raises:
        DeviceError: more processes on this machine than visible CUDA devices.
    """
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    if device.type == "cuda" and processes > gpus:
        raise DeviceError(
            f"{option} {processes}: each process on CUDA needs its own GPU and {gpus} CUDA "
            f"device(s) are visible; use {option} {gpus} or fewer, or --device cpu"
        )


def local_device(device: torch.device, world: World) -> torch.device:
    """On CUDA each rank uses its own GPU (LOCAL_RANK)."""
    if device.type == "cuda" and world.distributed:
        return torch.device("cuda", world.local_rank)
    return device


def all_reduce_sum(value: float | int, device: torch.device, world: World) -> float:
    if not world.distributed:
        return float(value)
    tensor = torch.tensor([float(value)], dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return float(tensor.item())


def all_reduce_max(values: list[float], device: torch.device) -> list[float]:
    """The element-wise maximum over all ranks (e.g. "any rank wants to stop")."""
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


def broadcast_text(text: str | None, world: World, device: torch.device) -> str:
    """Rank 0's ``text`` on every rank, sent as UTF-8 bytes (no pickling)."""
    if not world.distributed:
        assert text is not None
        return text
    data = text.encode("utf-8") if world.is_main and text is not None else b""
    size = torch.tensor([len(data)], dtype=torch.long, device=device)
    dist.broadcast(size, src=0)
    buffer = torch.zeros(int(size.item()), dtype=torch.uint8, device=device)
    if world.is_main:
        buffer.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    dist.broadcast(buffer, src=0)
    return bytes(buffer.cpu().tolist()).decode("utf-8")


def close(world: World, *, finished: bool = False) -> None:
    """Leave the process group; ``finished``: after a run that ended well on every rank."""
    if world.distributed and dist.is_initialized():
        if finished:
            # Every rank reaches the end before any tears its connections down: a rank that
            # left while rank 0 still validated and saved was seen to abort at exit. Never
            # after a failure, where the other ranks may never come.
            dist.barrier()
        dist.destroy_process_group()


def launch(nproc: int, argv: list[str]) -> int:
    """``tformer train --nproc N ...``: re-run the same command under torchrun on this node."""
    # Lazy: torchrun's module is needed only for this launch.
    from torch.distributed.run import main as torchrun_main

    if nproc < 1:
        raise ConfigError(f"--nproc {nproc} must be >= 1")
    args = ["--nproc-per-node", str(nproc), "--standalone", "-m", "tformer", *argv]
    # Share the cores out instead of letting every process use them all (torchrun's own
    # default is 1 thread each, with a warning).
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    try:
        torchrun_main(args)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    except Exception as error:  # torchrun's ChildFailedError: which ranks failed, and how
        return _report_failure(error)
    return 0


def _report_failure(error: Exception) -> int:
    """One line per failed rank; the exit code of the first failure (1 for a signal)."""
    failures = getattr(error, "failures", None) or {}
    if not failures:
        print(f"error: {str(error).strip().splitlines()[0]}", file=sys.stderr)
        return 1
    code = 1
    for rank, failure in sorted(failures.items()):
        exitcode = int(getattr(failure, "exitcode", 1))
        if exitcode < 0:
            try:
                how = f"was killed by {signal.Signals(-exitcode).name}"
            except ValueError:
                how = f"was killed by signal {-exitcode}"
        else:
            how = f"exited with code {exitcode}"
            code = exitcode if code == 1 else code
        print(
            f"error: rank {rank} (pid {getattr(failure, 'pid', '?')}) {how}; torchrun stopped "
            "the other ranks",
            file=sys.stderr,
        )
    return code


def wrap_for_training(
    model: TransformerBase, device: torch.device, world: World, compile_: bool
) -> torch.nn.Module:
    """What runs the forward pass: the model, wrapped for data parallelism and/or compiled.

    Checkpoints always save the bare model, so their tensor names carry no ``module.`` or
    ``_orig_mod.`` prefix and load anywhere.
    """
    forward: torch.nn.Module = model
    if world.distributed:
        # The only buffer is the fixed sinusoid table: no need to sync it every forward.
        parameters = inspect.signature(DistributedDataParallel).parameters
        sync_flag = (
            "forward_sync_buffers" if "forward_sync_buffers" in parameters else "broadcast_buffers"
        )
        options: dict[str, Any] = {sync_flag: False}
        forward = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None, **options
        )
    if compile_:
        forward = torch.compile(forward)  # type: ignore[assignment]
    return forward
