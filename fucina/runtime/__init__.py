"""Runtime layer: storage, raw tensors, execution contexts, scopes, grad mode."""
