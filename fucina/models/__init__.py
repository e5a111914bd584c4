"""Real models built on fucina's public API: ``fucina.models.bert`` (sentence embeddings)
and ``fucina.models.llama`` (Llama-architecture language models from GGUF)."""
