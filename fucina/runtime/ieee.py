"""numpy calls whose inf and NaN results are defined values: no numpy warnings or errors.

fucina's results follow IEEE arithmetic, as its kernels and torch do: a product
of operands holding inf or NaN gives inf or NaN and warns nowhere (compiled
programs run under ``np.errstate(all="ignore")``). The eager fast dot and a
compiled one-GEMM call reach numpy's BLAS outside a program, through the product
call :func:`fucina.tensor.fast.gemm_route` picks; :func:`quiet` wraps that call.
``np.errstate`` costs about 0.7 us per use (2-vCPU Zen 5 guest), on a tiny
product of about 1.7 us, so the wrapper sets numpy's error-state context
variable itself (0.14 us), which is what ``np.errstate(all="ignore")`` does on
numpy 2; on numpy 1.x it goes through ``np.seterr`` (thread-local there).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
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


_STATE, _IGNORE = _state()


def _quiet(fn: Callable[..., Any], state: Any, ignore: Any) -> Callable[..., Any]:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        token = state.set(ignore)
        try:
            return fn(*args, **kwargs)
        finally:
            state.reset(token)
    return call


def quiet(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` run as under ``np.errstate(all="ignore")``: floating-point errors neither
    warn nor raise, whatever the caller's numpy error state (restored on return)."""
    return _quiet(fn, _STATE, _IGNORE)
