"""numpy's floating-point error state, switched off around calls whose inf and NaN
results are defined values.

fucina's results follow IEEE arithmetic, as its kernels and torch do: a product
of operands holding inf or NaN gives inf or NaN and warns nowhere (compiled
programs run under ``np.errstate(all="ignore")``). The eager fast dot and a
compiled one-GEMM call reach numpy's BLAS outside a program, where numpy would
warn ("invalid value encountered in dot"). ``np.errstate`` costs about 0.7 us
per use there, on a tiny product of about 1.7 us, so those paths set numpy's
error-state context variable themselves (about 0.1 us)::

    token = FP_STATE.set(FP_IGNORE)
    try:
        ...  # the numpy call
    finally:
        FP_STATE.reset(token)

which is what ``np.errstate(all="ignore")`` does on numpy 2; on numpy 1.x the
same two calls go through ``np.seterr`` (thread-local there).
"""

from __future__ import annotations

from typing import Any

import numpy as np


class _Seterr:
    """``set``/``reset`` over ``np.seterr``, for a numpy without the context variable."""

    def set(self, _: Any) -> Any:
        return np.seterr(all="ignore")

    def reset(self, old: Any) -> None:
        np.seterr(**old)


def _state() -> tuple[Any, Any]:
    """(the error-state switch, the value that ignores every floating-point error)."""
    try:  # numpy >= 2: np.errstate sets this context variable to an error-state object
        from numpy._core import _ufunc_config
    except ImportError:  # pragma: no cover - numpy 1.x
        return _Seterr(), None
    var = getattr(_ufunc_config, "_extobj_contextvar", None)
    if var is None:  # pragma: no cover - a numpy that moved it
        return _Seterr(), None
    # (The state also holds numpy's buffer size and error callback, as at import:
    # neither reaches a BLAS call.)
    with np.errstate(all="ignore"):
        return var, var.get()


FP_STATE, FP_IGNORE = _state()
