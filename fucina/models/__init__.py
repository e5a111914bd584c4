"""Real models built on fucina's public API: ``fucina.models.bert`` (sentence embeddings)."""
