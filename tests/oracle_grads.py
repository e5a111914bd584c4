"""Checking a multi-input op against PyTorch, eager and compiled.

Callers skip themselves when torch is absent (``pytest.importorskip`` at the
top of the module).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import fucina as F

#: One operand: its tags, its values, whether it is differentiable (a variable).
Spec = tuple[tuple[str, ...], Any, bool]


def check_op(ctx: F.ExecContext, specs: Sequence[Spec], fu: Callable[..., Any],
             th: Callable[..., Any], *, seed: int = 0, rtol: float = 1e-5,
             atol: float = 1e-6, grad_rtol: float | None = None,
             grad_atol: float | None = None) -> None:
    """Forward values of ``fu`` against ``th`` and the gradients of ``sum(w * y)`` (fixed
    random ``w``) with respect to every differentiable operand, run eagerly and under
    ``fucina.compile`` (forward and backward in one program)."""
    import torch

    arrays = [np.asarray(a, dtype=np.float32) for _, a, _ in specs]
    tt = [torch.tensor(a, requires_grad=d) for a, (_, _, d) in zip(arrays, specs)]
    yt = th(*tt)
    w = np.random.default_rng(seed).standard_normal(tuple(yt.shape)).astype(np.float32)
    (yt * torch.tensor(w)).sum().backward()
    want_y = yt.detach().numpy()
    want_g = [t.grad.numpy() if d else None for t, (_, _, d) in zip(tt, specs)]
    g_rtol = rtol if grad_rtol is None else grad_rtol
    g_atol = atol if grad_atol is None else grad_atol

    def step(*xs: Any) -> Any:
        y = fu(*xs)
        weight = type(y).from_slice(ctx, y.shape, w.reshape(-1))
        y.mul(weight).sum_all().backward()
        return y

    for mode, fn in (("eager", step), ("compiled", F.compile(step))):
        xs = [F.Tensor(*tags).variable_from_slice(ctx, a.shape, a) if d
              else F.Tensor(*tags).from_slice(ctx, a.shape, a)
              for (tags, _, d), a in zip(specs, arrays)]
        y = fn(*xs)
        np.testing.assert_allclose(y.numpy().reshape(want_y.shape), want_y, rtol=rtol,
                                   atol=atol, equal_nan=True, err_msg=f"{mode} forward")
        for k, (x, g) in enumerate(zip(xs, want_g)):
            if g is None:
                continue
            got = x.grad()
            assert got is not None, f"{mode}: operand {k} got no gradient"
            np.testing.assert_allclose(got.numpy(), g, rtol=g_rtol, atol=g_atol,
                                       equal_nan=True, err_msg=f"{mode} grad of operand {k}")
