"""Gradient clipping by the global L2 norm (``torch.nn.utils.clip_grad_norm_``)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from ..ir.execute import current_tracer
from ..runtime.gradmode import no_grad
from ..tensor import Tensor
from ..tensor.arguments import real_value
from .inplace import assign
from .optimizer import _is_tensor, iter_params


def clip_grad_norm(params: Iterable[Any] | Any, max_norm: float) -> Any:
    """Scale the gradients of ``params`` so their global L2 norm is at most ``max_norm``.

    The total norm is ``sqrt(sum ||g||^2)`` over every parameter that has a
    gradient; when ``max_norm / (total + 1e-6) < 1`` every gradient is
    multiplied by that factor in place (torch's rule). Returns the total norm
    before clipping, as a float (0.0 when no parameter has a gradient). Inside
    a function ``fucina.compile`` traces, the clipping is part of the program
    and the norm is returned as a scalar tensor (``float()`` reads it).
    """
    ps = iter_params(params)
    for k, p in enumerate(ps):
        if not _is_tensor(p):
            raise TypeError(f"clip_grad_norm: params[{k}] must be a fucina tensor, got "
                            f"{type(p).__name__}")
    limit = real_value(max_norm)
    if limit is None:
        raise TypeError(f"clip_grad_norm: max_norm must be a real number, got {max_norm!r}")
    if not math.isfinite(limit) or limit < 0:
        raise ValueError(f"clip_grad_norm: max_norm must be finite and >= 0, got {max_norm!r}")
    tracer = current_tracer()
    if tracer is not None:
        return _traced_clip(tracer, ps, limit)
    grads = [g for g in (p.grad_view() for p in ps) if g is not None]
    if not grads:
        return 0.0
    with no_grad():
        total, coef = _norm_and_scale(grads, limit)
        c = float(coef.item())
        if c < 1.0 or math.isnan(c):  # (a scale of 1 leaves the gradients as they are)
            for g in grads:
                assign(g, g * coef)
    return float(total.item())


def _norm_and_scale(grads: list[Any], limit: float) -> tuple[Any, Any]:
    """The global norm and the scale ``min(limit / (norm + 1e-6), 1)`` as float32 scalar
    tensors, by the same operations eagerly and in a trace (so a compiled step clips
    exactly as the eager one: a float64 norm on the host differed in the last bit)."""
    sq = [(g * g).sum_all() for g in grads]
    total = sq[0]
    for s in sq[1:]:
        total = total + s
    total = total.sqrt()
    # torch: clamp(max_norm / (total + 1e-6), max=1); a NaN norm scales by NaN.
    return total, (limit / (total + 1e-6)).minimum(total.ones_like())


def _traced_clip(tracer: Any, ps: list[Any], limit: float) -> Any:
    """clip_grad_norm inside a trace: the norm and the scaling are program values."""
    if not hasattr(tracer, "set_grad"):
        raise TypeError("clip_grad_norm() cannot be traced here")
    with no_grad():
        grads = []
        for p in ps:
            node = tracer.grad(p._node)
            if node is not None:
                grads.append((p, type(p)._from_node(node, p._ctx)))
        if not grads:
            return Tensor().zeros(ps[0]._ctx, (1,)) if ps else 0.0
        total, coef = _norm_and_scale([g for _, g in grads], limit)
        for p, g in grads:
            tracer.set_grad(p._node, (g * coef)._node)
    return total
