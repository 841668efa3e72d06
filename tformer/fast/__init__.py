"""Speed-ups that are not the paper, kept beside the model rather than in it.

- ``accelerate``: :func:`~tformer.fast.accelerate.accelerate` swaps them into a built model
  (same state dict, same outputs): packed and split linear products (``linear``), the lean
  cached decoding step with folded cross-attention (``step``, ``attention``) and a cheaper
  dropout mask (``dropout``).
- ``process``: :func:`~tformer.fast.process.configure_process` applies the process-wide
  settings (huge pages, glibc's allocator, ``malloc``). It imports nothing heavy, so the
  command line can apply them before torch loads; this package therefore re-exports nothing.
"""
