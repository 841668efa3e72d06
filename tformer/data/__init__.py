"""Data: text pairs from files or hub datasets (sources), tokenizers (tokenizer, wordcache),
token ids (pairs, store; prepared folders and the id cache: prepare, prepared, parallel),
token-budget batches (batching), and the bundled date data (dates)."""
