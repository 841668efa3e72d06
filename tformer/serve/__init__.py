"""``tformer serve``: an HTTP translation service over one loaded checkpoint.

``create_app`` (in ``tformer.serve.app``) builds the FastAPI application: a JSON API described
by OpenAPI (``/docs``), server-sent events for streamed tokens, and one self-contained web
page at ``/``. Requests that arrive together are decoded in one batch by a single worker
thread that owns the model (``tformer.serve.batcher``).

FastAPI and uvicorn are an optional extra (``pip install "tformer[serve]"``): this module
imports neither, so ``require`` can say what to install before anything else loads them.
"""

from __future__ import annotations

import importlib.util

from tformer.errors import ConfigError

INSTALL = "pip install 'tformer[serve]'"
PACKAGES = ("fastapi", "uvicorn")


def require() -> None:
    """Refuse in one line when the serve extra is not installed.

    Raises:
        ConfigError: fastapi or uvicorn is missing.
    """
    missing = [name for name in PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(
            f"tformer serve needs the serve extra ({', '.join(missing)} missing): {INSTALL}"
        )
