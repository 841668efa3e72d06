"""An interactive attention page in ONE self-contained HTML file, after bertviz's head view.

The page embeds every map of the pair as JSON plus its own CSS and JavaScript: no network, no
external scripts or fonts. Selectors pick the kind, layer and head (a number, their mean, or
all heads); two views show the choice as a heatmap (hover a cell for its weight) or as lines
from each query token to the keys it attends to (hover a token to follow only its lines).
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from torch import Tensor

from tformer.analysis.attention import AttentionResult, AttentionSelection
from tformer.checkpoint.files import write_text_atomic
from tformer.config import SPECIAL_TOKENS
from tformer.data.display import is_special

DECIMALS = 4  # weights are stored rounded: enough for colours and hover values, 4x smaller

_AXES = {
    "encoder": ("source", "source"),
    "decoder": ("predicted", "target"),
    "cross": ("predicted", "source"),
}


def _rounded(maps: Tensor) -> list[Any]:
    scale = 10**DECIMALS
    return ((maps.double() * scale).round() / scale).tolist()


def page_data(result: AttentionResult, selection: AttentionSelection) -> dict[str, Any]:
    """What the page's script reads: tokens, every map, and the selection to open at."""
    return {
        "tokens": {
            "source": result.source_tokens,
            "target": result.target_tokens,
            "predicted": result.predicted_tokens,
        },
        "special": sorted({
            token
            for tokens in (result.source_tokens, result.target_tokens)
            for token in tokens
            if is_special(token)
        } | set(SPECIAL_TOKENS)),
        "kinds": {
            kind: {
                "rows": _AXES[kind][0],
                "columns": _AXES[kind][1],
                "weights": _rounded(result.maps(kind)),
            }
            for kind in result.kinds
        },
        "initial": {
            "kind": selection.kind,
            "layer": selection.layer,
            "head": selection.head,
        },
        "meta": {
            "checkpoint": selection.checkpoint,
            "source": result.source_text,
            "target": result.target_text,
            "target_generated": result.generated,
        },
    }


# The selectors, the hover line and the map: the same markup here and on `tformer serve`'s page.
CONTROLS = """<form id="controls" onsubmit="return false">
  <label>kind <select id="kind"></select></label>
  <label>layer <select id="layer"></select></label>
  <label>head <select id="head"></select></label>
  <label>view <select id="view">
    <option value="heatmap">heatmap</option><option value="lines">lines</option>
  </select></label>
</form>
<p id="hover">hover a cell or a token to see its weights</p>
<div id="root"></div>"""


def render_html(result: AttentionResult, selection: AttentionSelection) -> str:
    """The whole page as one string."""
    # "</" inside a script element would end it early; "<\/" reads the same to JSON.parse.
    data = json.dumps(page_data(result, selection), ensure_ascii=False).replace("</", "<\\/")
    title = html.escape(f"attention: {result.source_text} -> {result.target_text}")
    return (
        _TEMPLATE.replace("__TITLE__", title)
        .replace("__CONTROLS__", CONTROLS)
        .replace("__STYLE__", _STYLE)
        .replace("__SCRIPT__", _SCRIPT)
        .replace("__DATA__", data)
    )


def write_html(path: Path, result: AttentionResult, selection: AttentionSelection) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, render_html(result, selection))


_TEMPLATE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__</title>
<style>__STYLE__</style>
</head>
<body>
<h1>__TITLE__</h1>
<p id="provenance"></p>
__CONTROLS__
<script id="attention-data" type="application/json">__DATA__</script>
<script>__SCRIPT__</script>
</body>
</html>
"""

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5rem; color: #222; background: #fff; }
h1 { font-size: 1.1rem; }
#provenance, #hover { color: #555; font-size: 0.85rem; }
#hover { min-height: 1.2em; font-family: monospace; }
#controls label { margin-right: 1rem; }
.panel { display: inline-block; vertical-align: top; margin: 0 1.5rem 1.5rem 0; }
.panel h2, .group h2 { font-size: 0.9rem; margin: 0.2rem 0; }
table.heatmap { border-collapse: collapse; font-family: monospace; font-size: 12px; }
table.heatmap td { width: 18px; height: 18px; padding: 0; border: 1px solid #fff; }
table.heatmap td:hover { outline: 2px solid #e33; }
th.col { writing-mode: vertical-rl; transform: rotate(180deg); text-align: left;
         font-weight: normal; padding: 2px 0; max-height: 8em; white-space: nowrap; }
th.row { text-align: right; font-weight: normal; padding-right: 4px; white-space: nowrap; }
.special { color: #a0a; font-weight: bold; }
.lines { display: flex; font-family: monospace; font-size: 13px; }
.lines .side div { height: 20px; line-height: 20px; padding: 0 4px; cursor: default; }
.lines .left { text-align: right; }
.lines .side div:hover { background: #eee; }
.legend { font-size: 0.8rem; color: #555; }
.legend span { display: inline-block; width: 12px; height: 12px; vertical-align: middle; }
"""

_SCRIPT = r"""
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("attention-data").textContent);
  const RAMP = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
  const $ = (id) => document.getElementById(id);

  function colour(v) {
    const x = Math.min(Math.max(v, 0), 1) * (RAMP.length - 1);
    const lo = Math.floor(x), hi = Math.min(lo + 1, RAMP.length - 1), f = x - lo;
    const c = RAMP[lo].map((a, i) => Math.round(a + (RAMP[hi][i] - a) * f));
    return "rgb(" + c.join(",") + ")";
  }
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function token(tag, cls, text) {
    const e = el(tag, cls, text);
    if (data.special.includes(text)) e.classList.add("special");
    return e;
  }
  function mean(maps) {
    return maps[0].map((row, r) => row.map((_, c) =>
      maps.reduce((s, m) => s + m[r][c], 0) / maps.length));
  }
  function selected(kind, layer, head) {
    const heads = data.kinds[kind].weights[layer];
    const where = (text) => "layer " + layer + " \u00b7 " + text;
    if (head === "all") {
      return heads.map((m, h) => ({ title: where("head " + h), matrix: m, head: h }));
    }
    if (head === "mean") {
      return [{ title: where("mean of " + heads.length + " heads"), matrix: mean(heads),
                head: -1 }];
    }
    return [{ title: where("head " + head), matrix: heads[Number(head)], head: Number(head) }];
  }
  function show(text) { $("hover").textContent = text; }

  function heatmap(item, rows, cols) {
    const panel = el("div", "panel");
    panel.appendChild(el("h2", "", item.title));
    const table = el("table", "heatmap");
    const head = el("tr");
    head.appendChild(el("th"));
    cols.forEach((t) => head.appendChild(token("th", "col", t)));
    table.appendChild(head);
    item.matrix.forEach((row, r) => {
      const tr = el("tr");
      tr.appendChild(token("th", "row", rows[r]));
      row.forEach((v, c) => {
        const td = el("td");
        td.style.background = colour(v);
        td.title = rows[r] + " \u2192 " + cols[c] + ": " + v.toFixed(4);
        td.dataset.weight = v;
        td.addEventListener("mouseenter", () => show(td.title));
        tr.appendChild(td);
      });
      table.appendChild(tr);
    });
    panel.appendChild(table);
    return panel;
  }

  function lines(items, rows, cols) {
    const box = el("div", "lines panel");
    const left = el("div", "side left"), right = el("div", "side right");
    const height = 20 * Math.max(rows.length, cols.length);
    let parts = "";
    items.forEach((item) => {
      const hue = item.head < 0 ? 210 : (item.head * 360) / items.length;
      item.matrix.forEach((row, r) => row.forEach((v, c) => {
        if (v < 0.01) return;
        parts += '<line data-row="' + r + '" x1="0" y1="' + (20 * r + 10) + '" x2="160" y2="' +
          (20 * c + 10) + '" stroke="hsl(' + hue + ',70%,45%)" stroke-width="2" ' +
          'stroke-opacity="' + v.toFixed(3) + '"></line>';
      }));
    });
    const holder = el("div");
    holder.innerHTML = '<svg width="160" height="' + height + '">' + parts + "</svg>";
    const drawn = holder.firstChild;
    rows.forEach((t, r) => {
      const d = token("div", "tok", t);
      d.addEventListener("mouseenter", () => {
        drawn.querySelectorAll("line").forEach((l) => {
          l.style.display = Number(l.dataset.row) === r ? "" : "none";
        });
        const w = items.map((it) => it.matrix[r].map((v, c) => cols[c] + " " + v.toFixed(3)));
        show(t + " \u2192 " + w.map((x) => x.join(", ")).join(" | "));
      });
      d.addEventListener("mouseleave", () => {
        drawn.querySelectorAll("line").forEach((l) => { l.style.display = ""; });
      });
      left.appendChild(d);
    });
    cols.forEach((t) => right.appendChild(token("div", "tok", t)));
    box.append(left, drawn, right);
    if (items.length === 1) return box;
    const key = el("p", "legend", "colour = head: ");
    items.forEach((item) => {
      const k = el("b", "", " h" + item.head + " ");
      k.style.color = "hsl(" + (item.head * 360) / items.length + ",70%,45%)";
      key.appendChild(k);
    });
    const wrap = el("div");
    wrap.append(box, key);
    return wrap;
  }

  function legend() {
    if ($("view").value === "lines") {
      return el("p", "legend", "line opacity = weight (each row's weights sum to 1); " +
        "hover a token on the left to follow its lines");
    }
    const p = el("p", "legend", "weight 0 ");
    for (let i = 0; i <= 10; i++) {
      const s = el("span");
      s.style.background = colour(i / 10);
      p.appendChild(s);
    }
    p.appendChild(document.createTextNode(" 1 (each row sums to 1)"));
    return p;
  }

  function fill(select, options, value, fallback) {
    select.replaceChildren(...options.map(([v, label]) => {
      const o = el("option", "", label);
      o.value = String(v);
      return o;
    }));
    const known = options.some(([v]) => String(v) === String(value));
    select.value = String(known ? value : fallback);
  }
  function fillLayerHead(layer, head) {
    const weights = data.kinds[$("kind").value].weights;
    const last = weights.length - 1;
    fill($("layer"), [["all", "all"], ...weights.map((_, i) => [i, String(i)])], layer, last);
    const heads = weights[0].map((_, h) => [h, String(h)]);
    fill($("head"), [["mean", "mean"], ["all", "all"], ...heads], head, "mean");
  }

  function render() {
    const kind = $("kind").value, layer = $("layer").value, head = $("head").value;
    const info = data.kinds[kind];
    const rows = data.tokens[info.rows], cols = data.tokens[info.columns];
    const layers = layer === "all" ? info.weights.map((_, i) => i) : [Number(layer)];
    const groups = layers.map((i) => {
      const items = selected(kind, i, head);
      const group = el("div", "group");
      if ($("view").value === "lines") {
        group.appendChild(el("h2", "", items.length > 1 ? "layer " + i : items[0].title));
        group.appendChild(lines(items, rows, cols));
      } else {
        items.forEach((it) => group.appendChild(heatmap(it, rows, cols)));
      }
      return group;
    });
    $("root").replaceChildren(...groups, legend());
    $("root").dataset.rendered = kind + "/" + layer + "/" + head;
  }

  const m = data.meta;
  $("provenance").textContent = "source: " + m.source + " \u00b7 target (" +
    (m.target_generated ? "model output" : "given") + "): " + m.target +
    (m.checkpoint ? " \u00b7 checkpoint: " + m.checkpoint : "");
  // "page.html#kind=decoder&layer=0&head=all&view=lines" opens at that choice.
  const wanted = Object.assign({}, data.initial,
    Object.fromEntries(new URLSearchParams(location.hash.slice(1))));
  fill($("kind"), Object.keys(data.kinds).map((k) => [k, k]), wanted.kind, "cross");
  fillLayerHead(wanted.layer, wanted.head);
  if (wanted.view === "lines") $("view").value = "lines";
  $("kind").addEventListener("change", () => {
    fillLayerHead($("layer").value, $("head").value);
    render();
  });
  ["layer", "head", "view"].forEach((id) => $(id).addEventListener("change", render));
  render();
})();
"""

# The page's style and script, also drawn by tformer serve's web page (tformer/serve/page.py).
STYLE = _STYLE
SCRIPT = _SCRIPT
