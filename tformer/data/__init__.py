"""Data: text pairs from files or hub datasets (sources), tokenizers, token ids (pairs,
tokenized, cached), token-budget batches (batching), and the bundled date data (dates)."""
