"""The web page at ``/``: one self-contained file (no network, no CDN).

Type a source, choose decoding settings, watch the output stream in; below it, every attention
map of the chosen output (drawn by the same script as ``inspect-attention --save x.html``,
``tformer.cli.render_html``) and the per-step ``--explain`` table.
"""

from __future__ import annotations

import json
from importlib.resources import files

from tformer.cli import render_html
from tformer.config import SPECIAL_TOKENS


def page_html() -> str:
    """The whole page as one string."""
    template = files("tformer.serve").joinpath("page.html").read_text(encoding="utf-8")
    return (
        template.replace("__CONTROLS__", render_html.CONTROLS)
        .replace("__ATTENTION_STYLE__", render_html.STYLE)
        .replace("__ATTENTION_SCRIPT__", render_html.SCRIPT)
        .replace("__SPECIAL__", json.dumps(list(SPECIAL_TOKENS)))
    )
