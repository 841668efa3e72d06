"""Export a trained checkpoint for serving: CTranslate2 folders, and Hugging Face folders
(GPT-2, BERT, T5 or Marian, by the checkpoint's family).

``export_checkpoint(CKPT, OUT, to="ctranslate2" | "huggingface")`` is what ``tformer export``
calls. The target packages (``ctranslate2``, ``transformers``) are optional: they are imported
only inside the functions that need them (``pip install "tformer[export]"``), so importing
this package needs neither.
"""

from tformer.export.api import INSTALL, QUANTIZATIONS, TARGETS, export_checkpoint
from tformer.export.folder import MARKER

__all__ = ["INSTALL", "MARKER", "QUANTIZATIONS", "TARGETS", "export_checkpoint"]
