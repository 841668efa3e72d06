"""A run's CPU threads: recorded in its checkpoints, taken back on resume, forged values refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tformer.errors import CheckpointError
from tformer.training.threads import keep_threads, saved_threads, threads_state

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_a_cpu_run_records_its_threads_and_a_gpu_run_does_not() -> None:
    assert threads_state(CPU) == {"threads": 1}
    assert threads_state(torch.device("cuda")) == {}


def test_a_resume_takes_back_the_threads_the_run_trained_with() -> None:
    notes = keep_threads({"threads": 2}, CPU, Path("run/step-000010"))
    assert torch.get_num_threads() == 2
    assert notes == ["resuming with the 2 CPU threads the run trained with"]
    assert keep_threads({"threads": 2}, CPU, None) == []  # the same count: nothing to say
    assert keep_threads({}, CPU, None) == []  # a checkpoint older than the record


def test_an_explicit_thread_count_wins_and_the_run_says_what_it_costs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # what --threads 1 sets
    (note,) = keep_threads({"threads": 2}, CPU, None)
    assert torch.get_num_threads() == 1
    assert "resuming with 1 CPU threads where the run trained with 2" in note
    assert "differ in the last bits" in note


@pytest.mark.parametrize("value", [True, "2", 2.0, 0, -1, 10**9, [2]])
def test_a_forged_thread_count_is_refused(value: object) -> None:
    with pytest.raises(CheckpointError, match=r"step-000010: trainer_state.json records threads"):
        saved_threads({"threads": value}, Path("run/step-000010"))
