"""Benchmark rows for row programs and reductions (issue 13, target 3).

Row softmax, layer_norm and rms_norm over the last axis of a [rows, 1024] f32
matrix, and sum / mean / max over each axis of a [64, 256, 256] f32 tensor:
fucina eager and compiled against numpy and torch eager, side by side.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import fucina as F

from .bench import Case, best_time, torch

#: Tags of the 3-D reduction input, outermost first.
_AXES = ("a", "b", "c")


def _row_case(kind: str, rows: int, cols: int, quick: bool) -> Case:
    """softmax / layer_norm / rms_norm over the last axis."""
    ctx = F.ExecContext()
    x = F.Tensor("t", "d").randn(ctx, (rows, cols), 13)
    eps = 1e-5

    def prog(x: Any) -> Any:
        if kind == "softmax":
            return x.softmax("d")
        return x.layer_norm("d", eps) if kind == "layer_norm" else x.rms_norm("d", eps)

    fast = F.compile(prog)
    c = Case(f"{kind} [{rows},{cols}] f32 (rows)")
    mt = 0.05 if quick else 0.3
    c.eager = best_time(lambda: prog(x), mt)
    c.compiled = best_time(lambda: fast(x), mt)
    x0 = x.numpy()

    def np_prog() -> np.ndarray:
        if kind == "softmax":
            e = np.exp(x0 - x0.max(axis=1, keepdims=True))
            return e / e.sum(axis=1, keepdims=True)
        if kind == "layer_norm":
            d = x0 - x0.mean(axis=1, keepdims=True)
            return d / np.sqrt((d * d).mean(axis=1, keepdims=True) + np.float32(eps))
        return x0 / np.sqrt((x0 * x0).mean(axis=1, keepdims=True) + np.float32(eps))

    c.numpy = best_time(np_prog, mt)
    if torch is not None:
        tx = torch.from_numpy(x0)
        tfn: Callable[[], Any]
        if kind == "softmax":
            tfn = lambda: torch.softmax(tx, dim=1)  # noqa: E731
        elif kind == "layer_norm":
            tfn = lambda: torch.nn.functional.layer_norm(tx, (cols,), eps=eps)  # noqa: E731
        else:
            tfn = lambda: torch.nn.functional.rms_norm(tx, (cols,), eps=eps)  # noqa: E731
        c.torch = best_time(tfn, mt)
    c.notes["kernels"] = len(fast.kernels(x))
    c.notes["max_abs_err_vs_numpy"] = float(np.max(np.abs(fast(x).numpy() - np_prog())))
    return c


def _reduce_case(fn: str, axis: int, shape: tuple[int, int, int], quick: bool) -> Case:
    """``x.<fn>(tag)`` over one axis of a 3-D tensor."""
    ctx = F.ExecContext()
    x = F.Tensor(*_AXES).randn(ctx, shape, 17)
    tag = _AXES[axis]

    def prog(x: Any) -> Any:
        return getattr(x, fn)(tag)

    fast = F.compile(prog)
    c = Case(f"{fn} over {tag} (axis {axis}) of {list(shape)} f32")
    mt = 0.05 if quick else 0.3
    c.eager = best_time(lambda: prog(x), mt)
    c.compiled = best_time(lambda: fast(x), mt)
    x0 = x.numpy()
    c.numpy = best_time(lambda: getattr(x0, fn)(axis=axis), mt)
    if torch is not None:
        tx = torch.from_numpy(x0)
        if fn == "max":
            c.torch = best_time(lambda: torch.amax(tx, dim=axis), mt)
        else:
            c.torch = best_time(lambda: getattr(torch, fn)(tx, dim=axis), mt)
    ref = getattr(x0.astype(np.float64), fn)(axis=axis)
    c.notes["max_abs_err_vs_f64"] = float(np.max(np.abs(fast(x).numpy() - ref)))
    return c


def row_cases(quick: bool = False) -> list[Case]:
    """The issue-13 row and reduction rows (``quick``: small sizes)."""
    rows = 512 if quick else 4096
    shape = (8, 64, 64) if quick else (64, 256, 256)
    cases = [_row_case(k, rows, 1024, quick) for k in ("softmax", "layer_norm", "rms_norm")]
    cases += [_reduce_case(fn, axis, shape, quick) for fn in ("sum", "mean", "max")
              for axis in range(3)]
    return cases
