"""The static decoding step that CUDA graphs capture, run eagerly on the CPU here.

Its fixed-capacity caches, masked padding (rows and source), growth past a capacity and
reordering (beams, samples, finished rows) must give the eager cached step's outputs; the capture
itself is tested in tests/test_cuda.py.
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import same_hypotheses
from tformer.config import ModelConfig
from tformer.decoding.api import decode
from tformer.decoding.settings import DecodingConfig
from tformer.decoding.steppers import CachedStepper, make_stepper
from tformer.fast import graphs
from tformer.fast.accelerate import accelerate
from tformer.fast.graphs import GraphStepper
from tformer.model import Transformer


def model(**overrides: object) -> Transformer:
    torch.manual_seed(0)
    config = ModelConfig(
        src_vocab_size=60, tgt_vocab_size=60, d_model=32, n_heads=4, n_encoder_layers=2,
        n_decoder_layers=2, d_ff=64, dropout=0.0, max_len=128, **overrides,  # type: ignore[arg-type]
    )  # fmt: skip
    return accelerate(Transformer(config)).eval()


def sources() -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 60, (3, 11), generator=g)
    src[1, 6:] = 0  # padding, inside the source's bucket as well
    return src


CONFIGS = [
    DecodingConfig(max_new_tokens=40),
    DecodingConfig(beam_size=4, n_best=2, max_new_tokens=40),
    DecodingConfig(temperature=1.0, num_samples=3, seed=5, max_new_tokens=40),
]


@pytest.mark.parametrize("config", CONFIGS, ids=["greedy", "beam4", "samples3"])
@pytest.mark.parametrize(
    "overrides", [{}, {"norm": "pre", "positions": "learned"}, {"kv_heads": 2}],
    ids=["paper", "pre-norm-learned", "grouped"],
)  # fmt: skip
def test_the_static_step_decodes_as_the_eager_cached_step(
    config: DecodingConfig, overrides: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    net, src = model(**overrides), sources()
    eager = decode(net, src, config)
    monkeypatch.setattr(graphs, "DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(graphs, "FIRST_CAPACITY", 4)  # grown several times within 40 steps
    assert isinstance(make_stepper(net, src), GraphStepper)
    same_hypotheses(decode(net, src, config), eager)
    assert max(len(h.ids) for row in eager for h in row) > 8  # past two growths


def test_graphs_are_kept_per_shape_and_freed_after_each_decoding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    net, src = model(), sources()
    monkeypatch.setattr(graphs, "DEVICES", ("cuda", "cpu"))
    config = DecodingConfig(max_new_tokens=5)
    first = decode(net, src, config)
    kept = dict(net.__dict__["_step_graphs"])
    assert kept and not any(graph.busy for graph in kept.values())
    assert decode(net, src, config) == first
    assert net.__dict__["_step_graphs"] == kept  # the same shapes: no new graph
    with torch.inference_mode():  # as decoding runs
        stepper = make_stepper(net, src)
        assert isinstance(stepper, GraphStepper) and stepper.graph.busy
        # A second decoding while the first holds its graph gets its own.
        other = make_stepper(net, src)
    assert isinstance(other, GraphStepper) and other.graph is not stepper.graph


def test_graphs_are_captured_again_after_the_weights_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Validation during training decodes, the optimizer writes the weights, validation decodes
    # again: a kept graph would replay the old packed weights' addresses, so it is dropped.
    net, src = model(), sources()
    monkeypatch.setattr(graphs, "DEVICES", ("cuda", "cpu"))
    config = DecodingConfig(max_new_tokens=6)
    decode(net, src, config)
    before = dict(net.__dict__["_step_graphs"])
    with torch.no_grad():
        for parameter in net.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    after = decode(net, src, config)
    kept = net.__dict__["_step_graphs"]
    assert kept and all(kept[key] is not before.get(key) for key in kept)
    assert all(graph.weights == graphs.weights_signature(net) for graph in kept.values())
    monkeypatch.setattr(graphs, "DEVICES", ())
    same_hypotheses(after, decode(net, src, config))  # the eager step on the new weights


def test_graphs_stay_off_where_they_do_not_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    src = sources()
    assert isinstance(make_stepper(model(), src), CachedStepper)  # the CPU: not captured
    monkeypatch.setattr(graphs, "DEVICES", ("cuda", "cpu"))
    assert isinstance(make_stepper(model(positions="rope"), src), CachedStepper)
    monkeypatch.setenv(graphs.CUDA_GRAPHS, "0")
    assert isinstance(make_stepper(model(), src), CachedStepper)
