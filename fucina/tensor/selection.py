"""Selection (REFERENCE §4.16): top-k, sort, argsort, categorical sampling, MoE routing.

Index results are i64 tensors without gradient, owned by the caller even
inside an exec scope (the reference's typed-constant rule). ``top_k`` and
``sort`` values are gathered from the input through the indices, so their
gradient scatters back through them. Ordering: NaN never enters a top-k
(a lane with fewer than k non-NaN values ends in value -inf, index 0); a
sort puts NaN last in either direction; equal values keep their original
order.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from .. import tags as T
from ..dtypes import DType
from ..errors import InvalidDataLength, InvalidShape, TagError, UnsupportedGradient
from ..ir import selection as _prims  # noqa: F401 - registers the selection primitives
from ..ir.execute import emit
from ..ir.graph import Node
from ..kernels import selection as K
from ..rng import MASK64
from .arguments import flag_arg
from .base import Tensor, new, readable, result, tensor_type

if TYPE_CHECKING:
    from .branches import F32Tensor, I64Tensor


class TopKResult(NamedTuple):
    """``values`` (differentiable) and i64 ``indices`` of ``top_k`` / ``sort``."""

    values: F32Tensor
    indices: I64Tensor


class RouterTopKResult(NamedTuple):
    """The arrays ``router_top_k`` filled: expert ids and their routing weights."""

    selected: np.ndarray
    weights: np.ndarray


def _count(v: Any, what: str, low: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
        raise InvalidShape(f"{what} must be an integer >= {low}, got {v!r}")
    return int(v)


def _indices(self: Any, tags: tuple[str, ...], node: Node) -> Any:
    """An i64 index result: caller-owned, never released by an exec scope."""
    node.tags = tags
    return new(tensor_type(tags=tags, dtype=DType.i64), node, self._ctx, op_result=False)


def _gathered(self: Any, axis: int, idx: Node) -> Node:
    return emit("take_along", (self._node, idx), axis=axis, shape=idx.shape, dtype=DType.f32)


def _fill(shape: tuple[int, ...], dtype: DType, value: float) -> Node:
    one = emit("fill", (), shape=(1,), dtype=dtype, value=value)
    return emit("view", (one,), shape=shape, coeffs=tuple((0,) for _ in shape), base=(0,))


class Selection(Tensor):
    """Top-k, sort and argsort along a tag, categorical sampling, router top-k (f32)."""

    __slots__ = ()

    def top_k(self, tag: str, k: int, out_tag: str) -> TopKResult:
        """The ``k`` largest values along ``tag``, descending, and their i64 indices; the
        axis is retagged ``out_tag``. NaN never places: a lane with fewer than k non-NaN
        values fills its tail with value -inf, index 0 (torch ranks NaN highest). Equal
        values keep their order. ``values`` is differentiable (the gradient scatters
        back to the selected positions); ``indices`` is a constant."""
        axis = T.index(self.axis_tags, tag)
        out = T.replace_tag(self.axis_tags, tag, out_tag)
        n = self._node.shape[axis]
        k = _count(k, "k")
        if k > n:
            raise InvalidShape(f"top_k: k = {k} exceeds the size {n} of {tag!r}")
        raw = emit("topk_index", (self._node,), axis=axis, k=k, sort=False, descending=True)
        missing = emit("compare", (raw,), fn="lt", value=0)  # unfilled slots hold -1
        idx = emit("where", (missing, _fill(raw.shape, DType.i64, 0), raw))
        vals = emit("where", (missing, _fill(raw.shape, DType.f32, -math.inf),
                              _gathered(self, axis, idx)))
        return TopKResult(result(self, out, vals, DType.f32), _indices(self, out, idx))

    def sort(self, tag: str, descending: bool = False) -> TopKResult:
        """The values along ``tag`` in order, and each output position's source index.
        NaN sorts last in either direction (torch puts it first when descending); equal
        values keep their order. ``values`` is differentiable, ``indices`` constant."""
        axis = T.index(self.axis_tags, tag)
        n = self._node.shape[axis]
        idx = emit("topk_index", (self._node,), axis=axis, k=n, sort=True,
                   descending=flag_arg(descending, "descending"))
        vals = _gathered(self, axis, idx)
        return TopKResult(result(self, self.axis_tags, vals, DType.f32),
                          _indices(self, self.axis_tags, idx))

    def argsort(self, tag: str, descending: bool = False) -> I64Tensor:
        """The i64 source indices of :meth:`sort` alone (no gradient)."""
        axis = T.index(self.axis_tags, tag)
        n = self._node.shape[axis]
        idx = emit("topk_index", (self._node,), axis=axis, k=n, sort=True,
                   descending=flag_arg(descending, "descending"))
        return _indices(self, self.axis_tags, idx)

    def multinomial(self, class_tag: str, out_tag: str, num_samples: int, seed: int,
                    replacement: bool) -> I64Tensor:
        """``num_samples`` categorical draws per row from unnormalized non-negative
        weights along ``class_tag`` (the last tag; rank 1 or 2), as torch.multinomial;
        ``class_tag`` becomes ``out_tag`` in the i64 result.

        Draw (row, s) reads the counter stream at ``(seed, row * num_samples + s)``
        (``fucina.rng``): reproducible and independent of batching. Rows must be
        finite, >= 0, with a positive sum (InvalidShape otherwise); zero-weight
        classes are never drawn. Without replacement each draw removes its class,
        and more samples than a row's nonzero classes is InvalidShape. No gradient.
        """
        axis = T.index(self.axis_tags, class_tag)
        if self.tag_count not in (1, 2) or axis != self.tag_count - 1:
            raise TagError(f"multinomial samples along the last tag of a rank-1 or rank-2 "
                           f"tensor, got {class_tag!r} of {self.axis_tags}")
        out = T.replace_tag(self.axis_tags, class_tag, out_tag)
        num = _count(num_samples, "num_samples")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed must be an integer, got {seed!r}")
        n = self._node.shape[axis]
        replacement = flag_arg(replacement, "replacement")
        if not replacement and num > n:
            raise InvalidShape(f"multinomial without replacement: {num} samples from {n} "
                               f"classes")
        node = emit("multinomial", (self._node,), axis=axis, k=num, seed=int(seed) & MASK64,
                    replacement=replacement)
        return _indices(self, out, node)

    def router_top_k(self, expert_tag: str, k: int, selected: np.ndarray | None = None,
                     weights: np.ndarray | None = None, normalize_selected: bool = True,
                     ) -> RouterTopKResult:
        """The MoE router: per row of rank-2 [row, expert] logits (expert tag last), the
        top-k experts (as :meth:`top_k`) and their softmax probabilities over the full
        expert axis, renormalized to sum to 1 over the k when ``normalize_selected``.

        ``selected`` (an integer array) and ``weights`` (a float array), each of
        rows * k elements, are filled in place when given and allocated (int64,
        float32; shape [rows * k]) when omitted; both are returned. The input must
        not require grad (UnsupportedGradient). Host arrays are filled, so a traced
        tensor has no data to route (UnsupportedView under ``compile``).
        """
        axis = T.index(self.axis_tags, expert_tag)
        if self.tag_count != 2 or axis != 1:
            raise TagError(f"router_top_k takes rank-2 [row, expert] logits with the expert "
                           f"tag last, got {expert_tag!r} of {self.axis_tags}")
        if self.requires_grad:
            raise UnsupportedGradient("router_top_k is inference-only: detach() the logits")
        rows, n = self._node.shape
        k = _count(k, "k")
        if k > n:
            raise InvalidShape(f"router_top_k: k = {k} exceeds {n} experts")
        x = np.ascontiguousarray(readable(self).array(), dtype=np.float32)
        sel = _out_array(selected, rows * k, "selected", "iu", np.int64)
        wts = _out_array(weights, rows * k, "weights", "f", np.float32)
        s2 = np.empty((rows, k), np.int64)
        w2 = np.empty((rows, k), np.float32)
        K.router_rows(x, k, flag_arg(normalize_selected, "normalize_selected"), s2, w2)
        sel.reshape(-1)[...] = s2.reshape(-1)
        wts.reshape(-1)[...] = w2.reshape(-1)
        return RouterTopKResult(sel, wts)


def _out_array(arr: Any, count: int, what: str, kinds: str, default: Any) -> np.ndarray:
    """A caller's out array (checked) or a fresh one."""
    if arr is None:
        return np.empty(count, dtype=default)
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"{what} must be a numpy array, got {type(arr).__name__}")
    if arr.dtype.kind not in kinds or arr.dtype == np.bool_:
        raise TypeError(f"{what} must be a numpy {'integer' if 'i' in kinds else 'float'} "
                        f"array, got {arr.dtype}")
    if arr.size != count:
        raise InvalidDataLength(f"{what} holds {arr.size} elements, rows * k = {count}")
    if not arr.flags.writeable or not arr.flags.c_contiguous:
        raise InvalidDataLength(f"{what} must be a writable C-contiguous array")
    return arr
