"""tformer keeps freed CPU memory for reuse: a training step's tensors skip first-touch faults."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tformer.fast.malloc import glibc

# Where glibc puts a block (20 MB, and 64 MB: above its largest mmap threshold, as the logits
# of the base shape are) and what it does with it once freed, read from its own statistics
# (mallinfo2). By default a block that size gets its own mapping (returned to the system at
# free, so the next one starts as fresh pages); kept, it comes from the heap, and once freed it
# stays there, free for the next allocation. Huge pages are off, as in the others.
PLACEMENT_PROBE = """
import ctypes, sys
import torch
from tformer.fast.malloc import keep_freed_memory
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks",
                "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
applied = keep_freed_memory() if sys.argv[1] == "keep" else False
MB = 2**20
before = libc.mallinfo2()
block = torch.empty(int(sys.argv[2]) * MB // 4)  # float32
block.fill_(1.0)
mapped = (libc.mallinfo2().hblkhd - before.hblkhd) // MB
del block
print(applied, mapped, libc.mallinfo2().fordblks // MB)
"""

# Page faults per training step of a tiny model (after five steps of warm-up).
TRAINING_PROBE = """
import resource, sys
import torch
from tformer.config import ModelConfig
from tformer.training.loss import sequence_loss
from tformer.fast.malloc import keep_freed_memory
from tformer.model import Transformer
applied = keep_freed_memory() if sys.argv[1] == "keep" else False
torch.manual_seed(0)
config = ModelConfig(src_vocab_size=2000, tgt_vocab_size=2000, d_model=32, n_heads=2,
                     n_encoder_layers=1, n_decoder_layers=1, d_ff=64, dropout=0.1)
model = Transformer(config).train()
optimizer = torch.optim.Adam(model.parameters(), foreach=True)
src, tgt = torch.randint(4, 2000, (2, 32, 32))
def step():
    sequence_loss(model(src, tgt).logits, tgt, 0.1).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    step()
before = faults()
for _ in range(16):
    step()
print(applied, (faults() - before) / 16)
"""


def probe(script: str, mode: str, *args: str, **env: str) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if k != "TFORMER_KEEP_FREED_MEMORY"}
    return subprocess.run(
        [sys.executable, "-c", script, mode, *args],
        env={**clean, "THP_MEM_ALLOC_ENABLE": "0", **env},
        capture_output=True, text=True, check=True,
    ).stdout.split()


def has_mallinfo2() -> bool:
    libc = glibc()
    return libc is not None and hasattr(libc, "mallinfo2")  # glibc 2.33 and later


needs_glibc = pytest.mark.skipif(
    not has_mallinfo2(), reason="the C library is not glibc 2.33+: nothing to set or read"
)


@pytest.mark.slow
@needs_glibc
@pytest.mark.parametrize("mb", [20, 64])
def test_freed_blocks_stay_in_the_heap_for_reuse(mb: int) -> None:
    applied, mapped, free_mb = probe(PLACEMENT_PROBE, "keep", str(mb))
    assert applied == "True"
    assert int(mapped) == 0  # from the heap, not a mapping of its own
    assert int(free_mb) >= mb  # freed, and kept free in the heap rather than handed back
    applied, mapped, free_mb = probe(PLACEMENT_PROBE, "default", str(mb))
    assert applied == "False"
    assert int(mapped) >= mb and int(free_mb) < mb  # glibc's default: own mapping, unmapped


@pytest.mark.slow
@needs_glibc
def test_the_switch_turns_it_off() -> None:
    applied, mapped, free_mb = probe(PLACEMENT_PROBE, "keep", "20", TFORMER_KEEP_FREED_MEMORY="0")
    assert applied == "False"
    assert int(mapped) >= 20 and int(free_mb) < 20


@pytest.mark.slow
@needs_glibc
def test_training_steps_touch_few_fresh_pages() -> None:
    # With memory kept, a training step reuses the previous step's memory: measured 0 to 250
    # page faults a step (up to 1 MB of fresh pages) across machines. glibc's default varies
    # from run to run with the order of the step's allocations and frees (measured 47 to
    # 4,500 faults a step), so it is not a fixed reference; the placement test above is.
    applied, kept = probe(TRAINING_PROBE, "keep")
    assert applied == "True"
    assert float(kept) < 1_000, kept


@pytest.mark.slow
def test_a_training_run_leaves_the_allocator_alone_and_the_cli_applies_it(
    toy_data: Path, tmp_path: Path
) -> None:
    # A real (tiny) training run through the API, in a fresh process, changes nothing in the
    # process; the same run through the command line's entry point applies the settings.
    script = f"""
import sys
from pathlib import Path
from tformer import TrainConfig, preset, train
from tformer.cli import main
from tformer.fast import malloc
model = preset("tiny", d_model=32, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=64)
config = TrainConfig(data={str(toy_data)!r}, max_tokens=256, max_steps=2, save_every=10)
train(model, config, out=Path({str(tmp_path / "api")!r}), vocab_size=64)
after_api = malloc._applied
sys.argv = ["tformer", "train", "--data", {str(toy_data)!r}, "--out", {str(tmp_path / "cli")!r},
            "--preset", "tiny", "--max-steps", "2", "--max-tokens", "256", "--vocab-size", "64"]
try:
    main()
except SystemExit as done:
    assert not done.code, done.code
print("applied", after_api, malloc._applied)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-3:] == ["applied", "False", str(glibc() is not None)]
