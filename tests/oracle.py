"""Test helpers: building tensors, and checking an op against PyTorch autograd.

Callers that use :func:`check_against_torch` skip themselves when torch is
absent (``pytest.importorskip("torch")``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import fucina as F


def tensor(ctx: F.ExecContext, tags: tuple[str, ...], values: Any, dtype: str | None = None,
           variable: bool = False) -> Any:
    """A constant (or variable) tensor with ``tags`` holding ``values``."""
    v = np.asarray(values)
    T = F.Tensor(*tags, dtype=dtype) if dtype else F.Tensor(*tags)
    if variable:
        return T.variable_from_slice(ctx, v.shape, v)
    return T.from_slice(ctx, v.shape, v)


def check_against_torch(ctx: F.ExecContext, tags: tuple[str, ...], data: Any,
                        fu_op: Callable[[Any], Any], torch_op: Callable[[Any], Any], *,
                        rng: np.random.Generator, rtol: float = 1e-5, atol: float = 1e-6,
                        grad: bool = True) -> None:
    """Forward values and the input gradient of ``fu_op`` against ``torch_op``.

    The loss contracts the result with fixed random weights, so every output
    element's gradient differs.
    """
    import torch

    x0 = np.asarray(data, dtype=np.float32)
    x = F.Tensor(*tags).variable_from_slice(ctx, x0.shape, x0)
    xt = torch.tensor(x0, requires_grad=True)
    with ctx.exec_scope():
        y = fu_op(x)
        yt = torch_op(xt)
        y_np = y.numpy()
        np.testing.assert_allclose(y_np.reshape(yt.shape), yt.detach().numpy(), rtol=rtol,
                                   atol=atol, equal_nan=True)
        if not grad:
            return
        w = rng.standard_normal(y_np.shape).astype(np.float32)
        y.mul(type(y).from_slice(ctx, y_np.shape, w)).sum_all().backward()
    (yt * torch.tensor(w).reshape(yt.shape)).sum().backward()
    np.testing.assert_allclose(x.grad().numpy(), xt.grad.numpy(), rtol=rtol, atol=atol,
                               equal_nan=True)
