"""The IR: nodes, the closed set of primitive ops, the executor, autodiff, printing."""
