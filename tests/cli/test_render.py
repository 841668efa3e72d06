"""Attention rendering: Rich output at fixed widths, PNG images, the self-contained HTML page."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from rich.console import Console, RenderableType

from tformer.analysis.attention import AttentionResult
from tformer.analysis.head_stats import head_statistics
from tformer.cli.render import (
    head_grid,
    heatmap,
    overview,
    render_selection,
    stats_table,
    weight_rgb,
)
from tformer.cli.render_files import save_maps
from tformer.cli.render_html import render_html

WIDTHS = [80, 160]


def random_maps(layers: int, heads: int, rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(layers, heads, rows, cols, generator=generator) * 3).softmax(-1)


def fake_result(n_src: int = 6, n_tgt: int = 5, layers: int = 2, heads: int = 4) -> AttentionResult:
    """Maps of the right shapes, with sub-word-like labels; no model needed."""
    source = [f"▁w{i}" if i % 3 == 0 else f"p{i}" for i in range(n_src)]
    target = ["<bos>", *(f"▁t{i}" for i in range(n_tgt - 1))]
    decoder = random_maps(layers, heads, n_tgt, n_tgt, 1).tril()
    return AttentionResult(
        encoder=random_maps(layers, heads, n_src, n_src, 2),
        decoder=decoder / decoder.sum(-1, keepdim=True),
        cross=random_maps(layers, heads, n_tgt, n_src, 3),
        source_tokens=source,
        target_tokens=target,
        source_text=" ".join(source),
        target_text=" ".join(target[1:]),
        generated=False,
    )


def text_of(renderable: RenderableType, width: int) -> str:
    console = Console(record=True, width=width, file=io.StringIO(), color_system="truecolor")
    console.print(renderable)
    return console.export_text()


def assert_fits(text: str, width: int) -> None:
    too_long = [line for line in text.splitlines() if len(line) > width]
    assert not too_long, f"{len(too_long)} lines wider than {width}: {too_long[0]!r}"


def test_colour_scale_runs_from_dark_to_bright() -> None:
    assert weight_rgb(0.0) == (68, 1, 84)
    assert weight_rgb(1.0) == (253, 231, 37)
    assert weight_rgb(-3.0) == weight_rgb(0.0) and weight_rgb(7.0) == weight_rgb(1.0)
    assert sum(weight_rgb(0.3)) < sum(weight_rgb(0.7))


@pytest.mark.parametrize("width", WIDTHS)
def test_heatmap_has_token_labels_a_legend_and_fits(width: int) -> None:
    res = fake_result()
    text = text_of(heatmap(res.cross[0, 0], res.target_tokens, res.source_tokens, width=width,
                           title="cross attention"), width)
    assert_fits(text, width)
    lines = text.splitlines()
    assert lines[0] == "cross attention"
    for token in res.target_tokens:  # row labels, whole
        assert any(line.strip().startswith(token) for line in lines), token
    header = [line for line in lines[1:] if not line.lstrip().startswith(("<", "▁t"))]
    # Column labels read top to bottom: "▁w0" spans three lines of the header.
    columns = ["".join(line[i] for line in header[:3] if i < len(line)) for i in range(width)]
    assert "▁w0" in columns and "▁w3" in columns
    assert "weight 0" in lines[-1] and lines[-1].rstrip().endswith("tokens")
    assert "columns" not in text  # 6 columns fit: nothing folded


@pytest.mark.parametrize("width", WIDTHS)
def test_long_sequences_fold_into_blocks_of_columns(width: int) -> None:
    res = fake_result(n_src=90, n_tgt=12)
    text = text_of(heatmap(res.cross[0, 0], res.target_tokens, res.source_tokens, width=width,
                           values=True), width)
    assert_fits(text, width)
    blocks = re.findall(r"columns (\d+)-(\d+) of 90", text)
    assert len(blocks) >= 2
    assert int(blocks[0][0]) == 0 and int(blocks[-1][1]) == 89
    assert [int(a) for a, _ in blocks[1:]] == [int(b) + 1 for _, b in blocks[:-1]]  # no gaps
    # every row label appears once per block
    assert text.count("<bos>") == len(blocks)


def test_values_are_printed_on_request() -> None:
    matrix = torch.tensor([[1.0, 0.0], [0.25, 0.75]])
    text = text_of(heatmap(matrix, ["a", "b"], ["x", "y"], values=True), 80)
    assert "1.0 .00" in text and ".25 .75" in text
    assert ".25" not in text_of(heatmap(matrix, ["a", "b"], ["x", "y"]), 80)


@pytest.mark.parametrize("width", WIDTHS)
def test_head_grid_wraps_heads_and_folds_wide_maps(width: int) -> None:
    res = fake_result(n_src=8, heads=8)
    text = text_of(head_grid(res.cross[1], res.target_tokens, res.source_tokens, width=width,
                             title="all heads"), width)
    assert_fits(text, width)
    assert all(f"h{h}" in text for h in range(8)) and "<bos>" in text
    wide = fake_result(n_src=250, heads=2)
    text = text_of(head_grid(wide.cross[0], wide.target_tokens, wide.source_tokens,
                             width=width), width)
    assert_fits(text, width)
    assert "h0 [0-" in text and "h1 [0-" in text  # each head split into column blocks


@pytest.mark.parametrize("width", WIDTHS)
def test_overview_shows_one_line_of_maps_per_layer(width: int) -> None:
    res = fake_result(layers=3, heads=6)
    text = text_of(overview(res.encoder, res.source_tokens, res.source_tokens, width=width), width)
    assert_fits(text, width)
    assert [f"layer {i}" in text for i in range(3)] == [True] * 3
    assert all(f"h{h}" in text for h in range(6))
    # Two rows per character line: 6 source rows take 3 lines per map.
    assert text.count("▀" * 6) >= 3 * 3 * 6 // (1 if width >= 160 else 2)

    wide = fake_result(n_src=200, layers=2, heads=2)
    text = text_of(overview(wide.cross, wide.target_tokens, wide.source_tokens, width=width),
                   width)
    assert_fits(text, width)
    assert "of 200 shown" in text


@pytest.mark.parametrize("width", WIDTHS)
def test_render_selection_picks_the_view(width: int) -> None:
    res = fake_result()
    one = text_of(render_selection(res.selection("cross", -1, 2), width=width), width)
    assert "cross attention · layer 1 · head 2" in one
    grid = text_of(render_selection(res.selection("decoder", 0, "all"), width=width), width)
    assert "h3" in grid and "layer 0 · head all" in grid
    every = text_of(render_selection(res.selection("encoder", "all", "mean"), width=width), width)
    assert "layer 1" in every and "head mean" in every
    for text in (one, grid, every):
        assert_fits(text, width)


@pytest.mark.parametrize("width", WIDTHS)
def test_stats_table_lists_every_layer_and_head(width: int) -> None:
    res = fake_result(layers=2, heads=4)
    text = text_of(stats_table(head_statistics(res.encoder), "encoder"), width)
    assert_fits(text, width)
    assert "pattern" in text and "entropy" in text
    data_lines = [line for line in text.splitlines() if re.match(r"\s+\d+\s+\d+\s+\d", line)]
    assert len(data_lines) == 8


# -- files ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("layer", "head"), [(0, 0), (1, "all"), ("all", "all"), ("all", 2)])
def test_png_is_a_readable_image(tmp_path: Path, layer: int | str, head: int | str) -> None:
    import matplotlib.image

    res = fake_result()
    path = tmp_path / "map.png"
    save_maps(path, res, res.selection("cross", layer, head), values=True)  # type: ignore[arg-type]
    image = matplotlib.image.imread(str(path))
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert image[..., :3].std() > 0.05  # not a blank canvas


EXTERNAL = re.compile(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//|@import|<link\b""", re.I)


def test_html_is_one_self_contained_file(tmp_path: Path) -> None:
    res = fake_result()
    res = dataclasses.replace(res, source_tokens=["</script>", *res.source_tokens[1:]])
    page = render_html(res, res.selection("cross", 1, "mean", checkpoint="runs/x"))
    assert not EXTERNAL.search(page)
    assert "http://" not in page and "https://" not in page
    assert page.count("<script") == 2 and page.count("</script>") == 2  # a token cannot end it
    data = re.search(r'<script id="attention-data" type="application/json">(.*?)</script>',
                     page, re.S)
    assert data is not None
    parsed = json.loads(data.group(1))
    assert parsed["tokens"]["source"][0] == "</script>"
    assert parsed["initial"] == {"kind": "cross", "layer": 1, "head": "mean"}
    assert set(parsed["kinds"]) == {"encoder", "decoder", "cross"}
    weights = torch.tensor(parsed["kinds"]["cross"]["weights"])
    torch.testing.assert_close(weights, res.cross, atol=1e-4, rtol=0)
    assert parsed["meta"]["checkpoint"] == "runs/x"


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def test_html_renders_the_selected_map_in_headless_chromium(tmp_path: Path) -> None:
    browser = chromium()
    if browser is None:
        pytest.skip("chromium not installed: the HTML page is not rendered in a browser")
    res = fake_result(n_src=7, n_tgt=5)
    path = tmp_path / "attention.html"
    save_maps(path, res, res.selection("cross", 1, "all"))
    proc = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         f"--user-data-dir={tmp_path / 'profile'}",
         "--host-resolver-rules=MAP * ~NOTFOUND",  # no network: any lookup fails
         "--dump-dom", path.as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    assert 'data-rendered="cross/1/all"' in dom
    # One table per head, with the source tokens the script wrote as column labels.
    assert dom.count('<table class="heatmap">') == 4
    columns = re.findall(r'<th class="col[^"]*">([^<]*)</th>', dom)
    assert columns == res.source_tokens * 4
    rows = re.findall(r'<th class="row[^"]*">([^<]*)</th>', dom)
    assert rows[:5] == [*res.target_tokens[1:], "&lt;eos&gt;"]  # what each row predicts
    assert len(re.findall(r"<td [^>]*\bdata-weight=", dom)) == 4 * 5 * 7
