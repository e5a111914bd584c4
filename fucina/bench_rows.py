"""Benchmark rows for row programs and reductions (issue 13, target 3).

Row softmax, layer_norm and rms_norm over the last axis of a [rows, 1024] f32
matrix, sum / mean / max over each axis of a [64, 256, 256] f32 tensor, and a sum
over rows of 100 (a length that is not a multiple of the reduction lanes): fucina
eager and compiled against numpy and torch eager, side by side.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import fucina as F

from .bench import Case, _norm_case, side_by_side, torch

#: Tags of the 3-D reduction input, outermost first.
_AXES = ("a", "b", "c")


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
    x0 = x.numpy()
    tx = torch.from_numpy(x0) if torch is not None else None
    tfn = None if torch is None else torch.amax if fn == "max" else getattr(torch, fn)
    side_by_side(c, mt, eager=lambda: prog(x), compiled=lambda: fast(x),
                 numpy=lambda: getattr(x0, fn)(axis=axis),
                 torch=(lambda: tfn(tx, dim=axis)) if tfn is not None else None)
    ref = getattr(x0.astype(np.float64), fn)(axis=axis)
    c.notes["max_abs_err_vs_f64"] = float(np.max(np.abs(fast(x).numpy() - ref)))
    return c


def row_cases(quick: bool = False) -> list[Case]:
    """The issue-13 row and reduction rows (``quick``: small sizes)."""
    rows = 256 if quick else 4096  # quick: not run_suite's own 512-row norm rows
    shape = (8, 64, 64) if quick else (64, 256, 256)
    # run_suite's own row softmax is already [4096, 1024]; the norms there are [8192, 1024]
    cases = [_norm_case(k, rows, 1024, quick) for k in ("layer_norm", "rms_norm")]
    cases += [_reduce_case(fn, axis, shape, quick) for fn in ("sum", "mean", "max")
              for axis in range(3)]
    # rows of 100: not a multiple of the 32 lanes, so each row ends in a tail (stop 30
    # found such rows 9x slower than torch while the 256-wide rows above were ahead)
    cases.append(_reduce_case("sum", 2, (8, 8, 100) if quick else (64, 64, 100), quick))
    return cases
