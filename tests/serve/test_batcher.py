"""The worker's batching rules, without HTTP: the window, the token budget, settings apart."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")

from tformer.checkpoint.store import Checkpoint, load_checkpoint  # noqa: E402
from tformer.decoding.api import decode_texts  # noqa: E402
from tformer.decoding.settings import DecodingConfig  # noqa: E402
from tformer.serve.batcher import Batcher, Busy  # noqa: E402
from tformer.training.run import TrainResult  # noqa: E402

GREEDY = DecodingConfig(max_new_tokens=10)
SAMPLED = DecodingConfig(max_new_tokens=10, temperature=1.0, seed=3)


@pytest.fixture(scope="module")
def loaded(trained: TrainResult) -> Checkpoint:
    return load_checkpoint(trained.run_dir)


def run(loaded: Checkpoint, budget: int, configs: list[DecodingConfig]) -> tuple[int, list]:
    """Queue one job per config before the worker starts; the batches it took, the results."""
    batcher = Batcher(loaded.model, window_s=0.05, max_batch_tokens=budget, max_waiting=64)
    src = loaded.tokenizers.source.encode_batch([f"{n} {n + 1}" for n in range(len(configs))])
    futures = [batcher.submit([ids], config) for ids, config in zip(src, configs, strict=True)]
    batcher.start()
    results = [future.result(timeout=60) for future in futures]
    batcher.stop()
    for ids, config, result in zip(src, configs, results, strict=True):
        alone = decode_texts(loaded.model, [ids], config)
        assert [h.ids for h in result[0]] == [h.ids for h in alone[0]]
    return batcher.batches, results


def test_jobs_in_the_window_share_a_batch(loaded: Checkpoint) -> None:
    assert run(loaded, 10_000, [GREEDY] * 5)[0] == 1


def test_the_token_budget_closes_a_batch(loaded: Checkpoint) -> None:
    # Each job costs 1 row x (3 source tokens + 10 new tokens) = 13: two fit in 26.
    cost = 3 + GREEDY.max_new_tokens
    assert run(loaded, 2 * cost, [GREEDY] * 4)[0] == 2
    assert run(loaded, 1, [GREEDY] * 4)[0] == 4


def test_different_settings_decode_apart(loaded: Checkpoint) -> None:
    assert run(loaded, 10_000, [GREEDY, SAMPLED, GREEDY, SAMPLED])[0] == 2


def test_a_failing_call_reaches_its_caller_and_the_worker_goes_on(loaded: Checkpoint) -> None:
    batcher = Batcher(loaded.model, window_s=0.0, max_batch_tokens=100, max_waiting=8)
    batcher.start()
    failed = batcher.call(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        failed.result(timeout=10)
    assert batcher.call(lambda: 42).result(timeout=10) == 42
    batcher.stop()


def test_a_full_queue_refuses_at_once_and_serves_what_waits(loaded: Checkpoint) -> None:
    batcher = Batcher(loaded.model, window_s=0.0, max_batch_tokens=100, max_waiting=2)
    waiting = [batcher.submit([[5, 6]], GREEDY), batcher.call(lambda: 42)]
    with pytest.raises(Busy, match="2 requests are already waiting"):
        batcher.submit([[5, 6]], GREEDY)
    with pytest.raises(Busy):
        batcher.call(lambda: 43)
    batcher.start()
    assert len(waiting[0].result(timeout=60)) == 1 and waiting[1].result(timeout=60) == 42
    assert batcher.call(lambda: 44).result(timeout=60) == 44
    batcher.stop()
