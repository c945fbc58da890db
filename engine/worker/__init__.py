"""The real world's worker: a Llama-family model on torch over a paged KV cache (README.md)."""
