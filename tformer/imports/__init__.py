"""tformer import: published models in (Hugging Face Marian / OPUS-MT), as checkpoints."""

from tformer.imports.api import import_model

__all__ = ["import_model"]
