"""Checking a multi-operand op against PyTorch: forward, every input gradient, eager and
compiled (compiled must equal eager).

Callers skip themselves when torch is absent (``pytest.importorskip("torch")``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import fucina as F


@dataclass
class Arg:
    """One operand: its tags, values and whether it is a variable (differentiated)."""

    tags: tuple[str, ...]
    values: Any
    grad: bool = True


def _make(ctx: F.ExecContext, a: Arg) -> Any:
    v = np.asarray(a.values, dtype=np.float32)
    T = F.Tensor(*a.tags)
    if a.grad:
        return T.variable_from_slice(ctx, v.shape, v)
    return T.from_slice(ctx, v.shape, v)


def _check_compiled_forward(fu_fn: Callable[..., Any], ctx: F.ExecContext,
                            args: Sequence[Arg], want: np.ndarray, rtol: float, atol: float,
                            kernels: int | None) -> None:
    """The compiled forward alone equals eager (and has ``kernels`` kernels)."""
    consts = [_make(ctx, Arg(a.tags, a.values, False)) for a in args]
    fast = F.compile(fu_fn)
    np.testing.assert_allclose(fast(*consts).numpy(), want, rtol=rtol, atol=atol,
                               equal_nan=True, err_msg="compiled forward")
    if kernels is not None:
        assert len(fast.kernels(*consts)) == kernels, fast.ir(*consts)


def check_op(fu_fn: Callable[..., Any], torch_fn: Callable[..., Any], args: Sequence[Arg], *,
             seed: int = 0, rtol: float = 1e-5, atol: float = 1e-5,
             compiled_rtol: float = 1e-5, compiled_atol: float = 1e-6,
             kernels: int | None = None) -> None:
    """``fu_fn(*tensors)`` against ``torch_fn(*torch_tensors)``.

    The loss is the sum of the result times fixed random weights, so every output
    element's gradient differs. The compiled run traces forward and backward into one
    program and must reproduce the eager values and gradients. ``kernels`` asserts the
    kernel count of the compiled forward alone.
    """
    import torch

    rng = np.random.default_rng(seed)
    ctx = F.ExecContext()
    xs = [_make(ctx, a) for a in args]
    ts = [torch.tensor(np.asarray(a.values, dtype=np.float32), requires_grad=a.grad)
          for a in args]
    with ctx.exec_scope():
        y = fu_fn(*xs)
        y_np = y.numpy()
        yt = torch_fn(*ts)
        np.testing.assert_allclose(y_np, yt.detach().numpy().reshape(y_np.shape), rtol=rtol,
                                   atol=atol, equal_nan=True, err_msg="forward vs torch")
        w_np = rng.standard_normal(y_np.shape).astype(np.float32)
        W = type(y).from_slice(ctx, y_np.shape, w_np)
        if not any(a.grad for a in args):
            return _check_compiled_forward(fu_fn, ctx, args, y_np, compiled_rtol,
                                           compiled_atol, kernels)
        y.mul(W).sum_all().backward()
    (yt * torch.tensor(w_np).reshape(yt.shape)).sum().backward()
    eager_grads = []
    for k, (x, t, a) in enumerate(zip(xs, ts, args)):
        if not a.grad:
            continue
        g = x.grad().numpy()
        eager_grads.append(g)
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=rtol, atol=atol, equal_nan=True,
                                   err_msg=f"gradient of input {k} vs torch")

    _check_compiled_forward(fu_fn, ctx, args, y_np, compiled_rtol, compiled_atol, kernels)

    def step(*tensors: Any) -> Any:
        *ins, w = tensors
        out = fu_fn(*ins)
        out.mul(w).sum_all().backward()
        return out

    xs2 = [_make(ctx, a) for a in args]
    out = F.compile(step)(*xs2, W)
    np.testing.assert_allclose(out.numpy(), y_np, rtol=compiled_rtol, atol=compiled_atol,
                               equal_nan=True, err_msg="compiled forward (with backward)")
    got = [x.grad().numpy() for x, a in zip(xs2, args) if a.grad]
    for k, (g, e) in enumerate(zip(got, eager_grads)):
        np.testing.assert_allclose(g, e, rtol=compiled_rtol, atol=compiled_atol,
                                   equal_nan=True, err_msg=f"compiled gradient {k}")
