"""Gradient clipping by the global L2 norm (``torch.nn.utils.clip_grad_norm_``)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from ..runtime.gradmode import no_grad
from .inplace import assign, refuse_trace
from .optimizer import _is_tensor, iter_params


def clip_grad_norm(params: Iterable[Any] | Any, max_norm: float) -> float:
    """Scale the gradients of ``params`` so their global L2 norm is at most ``max_norm``.

    The total norm is ``sqrt(sum ||g||^2)`` over every parameter that has a
    gradient; when ``max_norm / (total + 1e-6) < 1`` every gradient is
    multiplied by that factor in place (torch's rule). Returns the total norm
    before clipping, as a float (0.0 when no parameter has a gradient).
    """
    refuse_trace("clip_grad_norm()")
    ps = iter_params(params)
    for k, p in enumerate(ps):
        if not _is_tensor(p):
            raise TypeError(f"clip_grad_norm: params[{k}] must be a fucina tensor, got "
                            f"{type(p).__name__}")
    limit = float(max_norm)
    if not math.isfinite(limit) or limit < 0:
        raise ValueError(f"clip_grad_norm: max_norm must be finite and >= 0, got {max_norm!r}")
    grads = [g for g in (p.grad_view() for p in ps) if g is not None]
    if not grads:
        return 0.0
    with no_grad():
        total = math.sqrt(sum(float((g * g).sum_all().item()) for g in grads))
        coef = limit / (total + 1e-6)
        if coef < 1.0 or math.isnan(coef):
            for g in grads:
                assign(g, g * coef)
    return total
