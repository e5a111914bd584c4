"""Benchmark rows for the vector-math unary functions and the fused chain's memory bound.

Each unary function runs compiled on a 4M float32 vector against numpy and
torch eager (issue 13, target 2); ``erf`` has no tensor op, so its row times a
parallel Numba loop over :func:`fucina.kernels.vecmath.erf_f32`, which is the
loop a generated kernel runs. The bandwidth-proxy row is a plain parallel
Numba loop ``x*w+x`` over the chain row's arrays (two reads, one write): the
chain row's time over it (``chain/proxy``) says how far the fused
``sigmoid(tanh(x*w+1)*x)`` kernel sits above the memory bound (target 1).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numba import njit, prange

import fucina as F

from .bench import Case, side_by_side, torch
from .kernels import vecmath as vm

__all__ = ["proxy_case", "unary_cases"]


@njit(parallel=True, fastmath=True, cache=True)
def _proxy(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    for i in prange(x.size):
        out[i] = x[i] * w[i] + x[i]
    return out


@njit(parallel=True, fastmath=True, error_model="numpy", cache=True)
def _par_erf(x: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    for i in prange(x.size):
        out[i] = vm.erf_f32(x[i])
    return out


# name -> (fucina method, numpy form, torch form, input transform)
_FNS: dict[str, tuple[str, Callable[[Any], Any], str, Callable[[np.ndarray], np.ndarray]]] = {
    "exp": ("exp", np.exp, "exp", lambda x: x),
    "tanh": ("tanh", np.tanh, "tanh", lambda x: x),
    "sigmoid": ("sigmoid", lambda x: 1 / (1 + np.exp(-x)), "sigmoid", lambda x: x),
    "silu": ("silu", lambda x: x / (1 + np.exp(-x)), "silu", lambda x: x),
    "gelu": ("gelu", None, "gelu_tanh", lambda x: x),  # type: ignore[dict-item]
    "gelu_erf": ("gelu_erf", None, "gelu", lambda x: x),  # type: ignore[dict-item]
    "log": ("log", np.log, "log", lambda x: np.abs(x) + np.float32(1e-3)),
    "erf": ("", None, "erf", lambda x: x),  # type: ignore[dict-item]
}


def _torch_fn(name: str) -> Callable[[Any], Any]:
    if name == "gelu_tanh":
        return lambda t: torch.nn.functional.gelu(t, approximate="tanh")
    if name == "gelu":
        return torch.nn.functional.gelu
    if name == "silu":
        return torch.nn.functional.silu
    return getattr(torch, name)


def unary_cases(n: int, quick: bool) -> list[Case]:
    """One row per unary function on ``n`` float32 values (compiled vs numpy and torch)."""
    rng = np.random.default_rng(13)
    base = (rng.standard_normal(n) * 3).astype(np.float32)
    mt = 0.05 if quick else 0.3
    return [_unary_case(name, base, mt) for name in _FNS]


def _unary_case(name: str, base: np.ndarray, mt: float) -> Case:
    method, np_fn, torch_name, prep = _FNS[name]
    x0 = prep(base)
    n = x0.size
    c = Case(f"unary {name} [{n}] f32")
    if method:
        ctx = F.ExecContext()
        x = F.Tensor("i").from_slice(ctx, (n,), x0)

        def op(t: Any) -> Any:
            return getattr(t, method)()

        fast = F.compile(op)
        impls = {"eager": lambda: op(x), "compiled": lambda: fast(x)}
        got = fast(x).numpy()
    else:  # erf: the parallel vecmath loop a kernel would run
        impls = {"compiled": lambda: _par_erf(x0)}
        got = _par_erf(x0)
    if np_fn is not None:
        impls["numpy"] = lambda: np_fn(x0)
    if torch is not None:
        tx, tf = torch.from_numpy(x0), _torch_fn(torch_name)
        impls["torch"] = lambda: tf(tx)
    with np.errstate(all="ignore"):  # numpy's overflow to inf is the expected value here
        side_by_side(c, mt, **impls)
    if torch is not None:
        want = tf(tx.double()).numpy()
        c.notes["max_rel_err_vs_torch"] = float(np.max(np.abs(got - want)
                                                       / np.maximum(1.0, np.abs(want))))
    return c


def proxy_case(chain: Case, quick: bool) -> Case:
    """The bandwidth proxy ``x*w+x`` over arrays of the chain row's size; notes the ratio."""
    n = int(chain.name.split("[")[1].split("]")[0])
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal(n).astype(np.float32)
    w0 = rng.standard_normal(n).astype(np.float32)
    c = Case(f"bandwidth proxy numba x*w+x [{n}] f32")
    mt = 0.05 if quick else 0.3
    tt = (torch.from_numpy(x0), torch.from_numpy(w0)) if torch is not None else None
    t = side_by_side(c, mt, compiled=lambda: _proxy(x0, w0),
                     torch=(lambda: tt[0] * tt[1] + tt[0]) if tt is not None else None)
    c.notes["GB/s"] = 3 * 4 * n / t["compiled"] / 1e9
    if chain.compiled is not None:
        c.notes["chain/proxy"] = float(chain.compiled) / t["compiled"]
    return c
