"""ExecContext: the owner of tensors, raw constructors and exec scopes."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from ..dtypes import DType, as_dtype
from ..errors import Deinitialized, InvalidShape, UnsupportedView
from .raw import RawTensor, check_shape
from .values import fill_value, values_array

__all__ = ["ExecContext", "values_array"]

#: Exec scopes open on all contexts and threads together, in a one-element list (hot
#: paths import the list and read ``[0]``). While it is 0 no thread has a scope open
#: on any context, so a result needs no scope lookup: a hot path reads this global
#: (~10 ns) and skips the thread-local ``ctx._local.scopes`` (~60 ns). It rises before
#: a scope is pushed and falls after it is popped, so a thread with a scope open always
#: sees it above 0; a lock keeps the threads' updates from losing each other.
SCOPES_OPEN = [0]
_open_lock = threading.Lock()


class ExecContext:
    """Every tensor belongs to the context that created it; ops run on it.

    Exec scopes (``with ctx.exec_scope():``) release every op result made
    inside when the block ends. Scopes are per thread: a scope opened on one
    thread adopts only the results that thread makes, so several threads can
    run ops on one context at once. After ``deinit()`` the context and every
    tensor it owns refuse use (``Deinitialized``).
    """

    def __init__(self) -> None:
        self._local = threading.local()
        self.closed = False

    # -- lifetime ---------------------------------------------------------------

    def deinit(self) -> None:
        """Close the context: its tensors (and new ones) raise ``Deinitialized`` from now."""
        self.closed = True

    def check_open(self) -> None:
        """Raise ``Deinitialized`` if the context was deinit'ed."""
        if self.closed:
            raise Deinitialized("the ExecContext was deinit'ed; its tensors cannot be used")

    def __enter__(self) -> ExecContext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.deinit()

    @property
    def _scopes(self) -> list[list[Any]]:
        """This thread's stack of open exec scopes (each a list of adopted results)."""
        try:
            return self._local.scopes
        except AttributeError:
            scopes: list[list[Any]] = []
            self._local.scopes = scopes
            return scopes

    @contextmanager
    def exec_scope(self) -> Iterator[ExecContext]:
        """Adopt op results made inside the block (on this thread); release them at its end."""
        self.check_open()
        scopes = self._scopes
        adopted: list[Any] = []
        with _open_lock:
            SCOPES_OPEN[0] += 1
        scopes.append(adopted)
        try:
            yield self
        finally:
            scopes.pop()
            with _open_lock:
                SCOPES_OPEN[0] -= 1
            for t in reversed(adopted):
                t._release_from_scope()

    def adopt(self, tensor: Any) -> bool:
        """Register an op result with this thread's innermost open scope; True if adopted."""
        scopes = self._scopes
        if scopes:
            scopes[-1].append(tensor)
            return True
        return False

    @property
    def scope_active(self) -> bool:
        """True while an exec scope is open on this thread."""
        return bool(self._scopes)

    # -- raw constructors (f32) -------------------------------------------------

    def from_slice(self, shape: Any, values: Any) -> RawTensor:
        """Copy ``values`` into a new f32 raw tensor of ``shape``."""
        return self.from_slice_typed(DType.f32, shape, values)

    def empty(self, shape: Any) -> RawTensor:
        """Uninitialized f32 raw tensor."""
        return self.empty_typed(DType.f32, shape)

    def zeros(self, shape: Any) -> RawTensor:
        """f32 zeros."""
        return self.full_typed(DType.f32, shape, 0)

    def ones(self, shape: Any) -> RawTensor:
        """f32 ones."""
        return self.full_typed(DType.f32, shape, 1)

    def full(self, shape: Any, value: float) -> RawTensor:
        """f32 filled with ``value``."""
        return self.full_typed(DType.f32, shape, value)

    def scalar(self, value: float) -> RawTensor:
        """Single-element f32 raw tensor of shape (1,)."""
        return self.full_typed(DType.f32, (1,), value)

    # -- typed forms --------------------------------------------------------------

    def from_slice_typed(self, dtype: Any, shape: Any, values: Any) -> RawTensor:
        """Copy ``values`` into a new raw tensor of ``dtype``."""
        self.check_open()
        dt = as_dtype(dtype)
        shp = check_shape(shape)
        return RawTensor.from_array(dt, values_array(dt, shp, values), shp)

    def empty_typed(self, dtype: Any, shape: Any) -> RawTensor:
        """Uninitialized raw tensor of ``dtype``."""
        self.check_open()
        return RawTensor.empty(as_dtype(dtype), check_shape(shape))

    def zeros_typed(self, dtype: Any, shape: Any) -> RawTensor:
        """Zeros of ``dtype``."""
        return self.full_typed(dtype, shape, 0)

    def ones_typed(self, dtype: Any, shape: Any) -> RawTensor:
        """Ones of ``dtype``."""
        return self.full_typed(dtype, shape, 1)

    def full_typed(self, dtype: Any, shape: Any, value: Any) -> RawTensor:
        """``dtype`` raw tensor filled with ``value`` (cast by the dtype's rules)."""
        self.check_open()
        dt = as_dtype(dtype)
        if dt.is_block:
            raise InvalidShape(f"{dt.value} tensors are built from blocks, not filled")
        shp = check_shape(shape)
        out = RawTensor.empty(dt, shp)
        out.array()[...] = fill_value(dt, value)
        return out

    def scalar_typed(self, dtype: Any, value: Any) -> RawTensor:
        """Single-element raw tensor of ``dtype``."""
        return self.full_typed(dtype, (1,), value)

    # -- RoPE tables (fucina.runtime.rope) ------------------------------------------

    def prepare_rope_table(self, positions: Any, feature_dim: int, theta_base: float,
                           inverse: bool = False) -> Any:
        """A ``fucina.RopeTable`` for ``positions`` (sequence, numpy ints or integer tensor):
        pair ``i`` at position ``p`` turns by ``p * theta_base**(-2i/feature_dim)``
        (negated when ``inverse``)."""
        from . import rope

        return rope.prepare(_host(positions), feature_dim, theta_base, inverse)

    def prepare_rope_table_factors(self, positions: Any, feature_dim: int, theta_base: float,
                                   inverse: bool, freq_factors: Any) -> Any:
        """``prepare_rope_table`` with each pair's frequency divided by ``freq_factors[i]``
        (ggml ``rope_ext`` scaling: Llama-3 long context, Gemma global layers)."""
        from . import rope

        return rope.prepare(_host(positions), feature_dim, theta_base, inverse, freq_factors)

    def prepare_rope_table_range(self, range: Any, feature_dim: int, theta_base: float,
                                 inverse: bool = False) -> Any:
        """``prepare_rope_table`` over the positions of a ``fucina.AxisRange``
        (bitwise identical to the same run given as an array)."""
        from . import rope

        return rope.prepare(_range(range), feature_dim, theta_base, inverse)

    def prepare_rope_table_factors_range(self, range: Any, feature_dim: int,
                                         theta_base: float, inverse: bool,
                                         freq_factors: Any) -> Any:
        """``prepare_rope_table_factors`` over the positions of a ``fucina.AxisRange``."""
        from . import rope

        return rope.prepare(_range(range), feature_dim, theta_base, inverse, freq_factors)

    def prepare_rope_table_inv_freqs_f64(self, pos0: int, count: int, inv_freq: Any,
                                         inverse: bool = False) -> Any:
        """A table for positions ``pos0 .. pos0 + count`` from per-pair f64 inverse
        frequencies (angles accumulated in f64, rounded once to f32)."""
        from . import rope

        return rope.prepare_inv_freqs_f64(pos0, count, inv_freq, inverse)

    def yarn_blend_inv_freqs_f64(self, dim: int, base: float, factor: float,
                                 orig_ctx: int) -> np.ndarray:
        """DeepSeek-family YaRN inverse frequencies (f64, ``dim / 2`` pairs); feed them to
        ``prepare_rope_table_inv_freqs_f64``."""
        from . import rope

        return rope.yarn_blend_inv_freqs_f64(dim, base, factor, orig_ctx)


def _host(positions: Any) -> Any:
    """Positions given as a fucina tensor are read on the host (tables are host data).

    A tensor traced by ``compile`` has no values yet and a table cannot be a program
    value: UnsupportedView naming the op and the traced alternative."""
    if hasattr(positions, "_node_") and hasattr(positions, "numpy"):
        node = positions._node_
        if node is not None and node.value.is_symbolic:
            raise UnsupportedView(
                "prepare_rope_table: a RopeTable is host data built outside compile; inside "
                "a compiled function pass fucina.RopeTheta(positions=tensor, theta_base=...) "
                "to rope() (a traced input)")
        return positions.numpy()
    return positions


def _range(r: Any) -> Any:
    from .rope import AxisRange

    if not isinstance(r, AxisRange):
        raise TypeError(f"range must be a fucina.AxisRange, got {type(r).__name__}")
    return r
