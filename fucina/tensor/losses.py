"""Losses and similarity (REFERENCE §4.15), f32.

Cross-entropy and the fused linear losses are primitives (``ir/fused_losses``:
one pass over the logits each way, and the linear forms never hold a second
[rows, classes] buffer); the elementwise losses, ``nll_loss`` and
``cosine_similarity`` are compositions of primitives, so their gradients,
fusion and compilation come from the primitives.

Reductions: ``"mean"`` (over every element for the elementwise losses, over
the positions not ignored for cross-entropy), ``"sum"``, ``"none"`` (per
element / per position, with the input's remaining tags).

Labels and other host index data accept a sequence, a numpy integer array or
an integer fucina tensor (a traced input under ``compile``: its values are
checked when the program runs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from .. import tags as T
from ..dtypes import DType
from ..errors import (
    InvalidDataLength,
    InvalidShape,
    ShapeMismatch,
    TagError,
    UnsupportedGradient,
)
from ..ir import fused_losses as FL
from ..ir.execute import current_tracer, emit
from ..ir.graph import Node, leaf
from ..kernels.losses import STAT_KEEP, STAT_LOSS
from ..runtime.gradmode import is_grad_enabled, no_grad
from ..runtime.raw import RawTensor, contiguous_strides
from .arguments import choice_arg, flag_arg, real_arg
from .base import Tensor, align_node, check_tensor, result, same_ctx

if TYPE_CHECKING:
    from typing_extensions import Self

    from .branches import F32Tensor

_REDUCTIONS = ("mean", "sum", "none")
#: bce on probabilities clamps them to [BCE_EPS, 1 - BCE_EPS] (the reference's bce_eps).
BCE_EPS = 1e-7

# -- argument helpers ----------------------------------------------------------------------


def _reduction(reduction: str, allowed: tuple[str, ...] = _REDUCTIONS) -> str:
    return choice_arg(reduction, allowed, "reduction")


def _ce_options(reduction: str, ignore_index: Any, label_smoothing: Any,
                ) -> tuple[int | None, float]:
    """Checked cross-entropy options: (ignored label or None, smoothing)."""
    _reduction(reduction)
    if ignore_index is not None and (isinstance(ignore_index, bool)
                                     or not isinstance(ignore_index, (int, np.integer))):
        raise TypeError(f"ignore_index must be an int or None, got {ignore_index!r}")
    if ignore_index is not None and not -(2**63) <= int(ignore_index) < 2**63:
        raise InvalidShape(f"ignore_index must fit in int64 (labels are i64), got "
                           f"{ignore_index}")
    smooth = real_arg(label_smoothing, "label_smoothing")
    if not 0.0 <= smooth < 1.0:
        raise InvalidShape(f"label_smoothing must lie in [0, 1), got {label_smoothing}")
    return (None if ignore_index is None else int(ignore_index)), smooth


def _const_node(arr: np.ndarray, dtype: DType) -> Node:
    return leaf(RawTensor.from_array(dtype, arr, arr.shape), None, False)


def _check_sizes(data: Any, tags: Sequence[str], shape: Sequence[int], what: str) -> None:
    """``data`` (holding ``tags`` in any order) has ``shape``'s size at each tag."""
    sizes = dict(zip(data.axis_tags, data.shape))
    for t, d in zip(tags, shape):
        if sizes[t] != d:
            raise ShapeMismatch(f"{what}: tag {t!r} has size {sizes[t]}, expected {d}")


def index_node(self: Any, data: Any, count: int, what: str,
               rest: tuple[tuple[str, ...], tuple[int, ...]] | None = None) -> Node:
    """An i64 [count] node from host index data or an integer tensor.

    A tensor tagged with the ``rest`` tags (any order) is read in that tag order;
    any other tensor, and host data, as a flat row-major sequence. The values are
    checked by the IR (``ir/checks.py``) before any kernel reads them: at once in
    eager mode, as a program step under ``compile``.
    """
    if isinstance(data, Tensor):
        check_tensor(data, what)
        same_ctx(self, data)
        if not data.dtype.is_integer:
            raise InvalidDataLength(f"{what} must be integers, got a {data.dtype.value} tensor")
        node = data._node
        if node.value.numel != count:
            raise InvalidShape(f"{node.value.numel} {what} for {count} positions")
        if rest is not None and rest[0] and set(data.axis_tags) == set(rest[0]):
            # (same count, other sizes: the labels of other positions)
            _check_sizes(data, rest[0], rest[1], what)
            node = align_node(data, rest[0], rest[1])
        if not node.value.is_contiguous():
            node = emit("copy", (node,))
        node = emit("reshape", (node,), shape=(count,))
        if data.dtype is not DType.i64:
            node = emit("cast", (node,), dtype=DType.i64, src=data.dtype)
        return node
    try:
        arr = np.asarray(data)
    except (TypeError, ValueError):
        raise InvalidDataLength(f"{what} must be a sequence of integers") from None
    if arr.dtype == np.bool_ or arr.dtype.kind not in "iu":
        raise InvalidDataLength(f"{what} must be integers, got {arr.dtype}")
    flat = arr.reshape(-1).astype(np.int64)
    if flat.size != count:
        raise InvalidShape(f"{flat.size} {what} for {count} positions")
    return _const_node(flat, DType.i64)


def _float_vector(self: Any, data: Any, count: int, what: str) -> Node:
    """An f32 [count] node from a sequence, numpy array or f32 tensor (no gradient)."""
    if isinstance(data, Tensor):
        check_tensor(data, what)
        same_ctx(self, data)
        if data.dtype is not DType.f32:
            raise TagError(f"{what} must be an f32 tensor, got {data.dtype.value}")
        if data.requires_grad:
            raise UnsupportedGradient(f"{what} are constant targets: detach() them first")
        node = data._node
        if node.value.numel != count:
            raise InvalidShape(f"{node.value.numel} {what} for {count} entries")
        if not node.value.is_contiguous():
            node = emit("copy", (node,))
        return emit("reshape", (node,), shape=(count,))
    try:
        arr = np.asarray(data, dtype=np.float32).reshape(-1)
    except (TypeError, ValueError, OverflowError):  # (an int beyond float)
        raise InvalidDataLength(f"{what} must be a sequence of numbers") from None
    if arr.size != count:
        raise InvalidShape(f"{arr.size} {what} for {count} entries")
    return _const_node(arr, DType.f32)


def _count_of(data: Any, what: str) -> int:
    if isinstance(data, Tensor):
        check_tensor(data, what)
        return int(data._node.value.numel)
    try:
        n = int(np.asarray(data).size)
    except (TypeError, ValueError):
        raise InvalidDataLength(f"{what} must be a sequence") from None
    if n == 0:
        raise InvalidShape(f"no {what} given")
    return n


def _stats_column(stats: Node, col: int, shape: tuple[int, ...]) -> Node:
    """Column ``col`` of [positions, STATS] stats viewed at the positions' shape."""
    strides = contiguous_strides(shape)
    return emit("view", (stats,), shape=shape, coeffs=tuple((s, 0) for s in strides),
                base=(0, col))


def _finish_rows(self: Any, stats: Node, rest_tags: tuple[str, ...],
                 rest_shape: tuple[int, ...], reduction: str) -> Any:
    """Per-position losses from cross-entropy stats, reduced."""
    shape = rest_shape or (1,)
    per = _stats_column(stats, STAT_LOSS, shape)
    if reduction == "none":
        return result(self, rest_tags, emit("copy", (per,)), DType.f32)
    axes = tuple(range(len(shape)))
    total = emit("reduce", (per,), fn="sum", axes=axes, dtype=DType.f32)
    if reduction == "mean":
        with no_grad():  # the count of kept positions is a constant of the labels
            keep = _stats_column(stats, STAT_KEEP, shape)
            count = emit("reduce", (keep,), fn="sum", axes=axes, dtype=DType.f32)
            # all positions ignored: 0 / 1 = 0 (the reference's deliberate choice)
            count = emit("unary", (count,), fn="clamp", params=(1.0, math.inf))
        total = emit("binary", (total, count), fn="div")
    return result(self, (), total, DType.f32)


def _finish_elementwise(self: Any, per: Node, reduction: str) -> Any:
    if reduction == "none":
        return result(self, self.axis_tags, per, DType.f32)
    axes = tuple(range(len(per.shape)))
    return result(self, (), emit("reduce", (per,), fn=reduction, axes=axes, dtype=DType.f32),
                  DType.f32)


def _target(self: Any, target: Any) -> Node:
    """``target`` (same tags, any order, same sizes, f32) aligned to ``self``."""
    check_tensor(target, "target")
    same_ctx(self, target)
    if target.dtype is not DType.f32:
        raise TagError(f"target must be f32, got {target.dtype.value}")
    if set(target.axis_tags) != set(self.axis_tags):
        raise TagError(f"target tags {target.axis_tags} differ from {self.axis_tags}")
    _check_sizes(target, self.axis_tags, self.shape, "target")
    return align_node(target, self.axis_tags, self.shape)


def _bin(fn: str, a: Node, b: Node) -> Node:
    return emit("binary", (a, b), fn=fn)


def _scalar(fn: str, a: Node, v: float) -> Node:
    return emit("scalar", (a,), fn=fn, value=v)


def _unary(fn: str, a: Node, params: tuple[float, ...] = ()) -> Node:
    if params:
        return emit("unary", (a,), fn=fn, params=params)
    return emit("unary", (a,), fn=fn)


def _fill_like(x: Node, value: float, dtype: DType = DType.f32) -> Node:
    """``value`` broadcast over ``x``'s shape (one element, stride 0: no full buffer)."""
    one = emit("fill", (), shape=(1,), dtype=dtype, value=value)
    return emit("view", (one,), shape=x.shape, coeffs=tuple((0,) for _ in x.shape),
                base=(0,))


def _check_linear(self: Any, weight: Any) -> tuple[str, str]:
    """The (row, class) tags of a fused linear loss; checks the operand contract."""
    check_tensor(weight, "weight")
    same_ctx(self, weight)
    if self.tag_count != 2 or weight.tag_count != 2:
        raise TagError(f"fused linear losses take rank-2 operands, got {self.axis_tags} and "
                       f"{weight.axis_tags}")
    if weight.dtype is not DType.f32:
        raise TagError(f"weight must be f32, got {weight.dtype.value}")
    shared = self.axis_tags[1]
    if weight.axis_tags[1] != shared:
        raise TagError(f"the shared tag {shared!r} must be last on both operands, weight has "
                       f"{weight.axis_tags}")
    cls = weight.axis_tags[0]
    if cls in self.axis_tags:
        raise TagError(f"the class tag {cls!r} must not be a tag of the input")
    if self.shape[1] != weight.shape[1]:
        raise ShapeMismatch(f"shared tag {shared!r}: sizes {self.shape[1]} and "
                            f"{weight.shape[1]}")
    return self.axis_tags[0], cls


def _needs_record(*xs: Any) -> bool:
    return is_grad_enabled() and any(x.requires_grad for x in xs)


class Losses(Tensor):
    """Losses and similarity (f32): cross-entropy (plain and fused with a linear
    layer), distillation, elementwise regression/classification losses, NLL, cosine."""

    __slots__ = ()

    # -- cross-entropy -------------------------------------------------------------------

    def cross_entropy(self, class_tag: str, labels: Sequence[int] | np.ndarray | Tensor,
                      reduction: str = "mean", ignore_index: int | None = None,
                      label_smoothing: float = 0.0) -> Self:
        """Log-softmax + NLL over ``class_tag`` against integer ``labels`` (torch parity).

        ``labels`` holds one class per position, positions ordered row-major over
        the remaining tags. ``reduction`` is "mean" (over positions not equal to
        ``ignore_index``; 0 when every position is ignored), "sum" or "none"
        (per-position losses, ``class_tag`` removed). ``label_smoothing`` in
        [0, 1) mixes the one-hot target with the uniform distribution. Labels
        must lie in [0, classes) or equal ``ignore_index`` (IndexOutOfBounds).
        Differentiable in the logits.
        """
        c = T.index(self.axis_tags, class_tag)
        ignore, smooth = _ce_options(reduction, ignore_index, label_smoothing)
        shape = self.shape
        rest_shape = tuple(d for i, d in enumerate(shape) if i != c) if self.tag_count > 1 \
            else ()
        positions = math.prod(rest_shape)
        rest_tags = T.remove_tags(self.axis_tags, (class_tag,))
        lab = index_node(self, labels, positions, "labels", (rest_tags, rest_shape))
        stats = emit("ce_rows", (self._node, lab), axis=c, ignore=ignore, smooth=smooth)
        return cast("Self", _finish_rows(self, stats, rest_tags, rest_shape, reduction))

    def cross_entropy_ext(self, class_tag: str, labels: Sequence[int] | np.ndarray | Tensor,
                          reduction: str = "mean", ignore_index: int | None = None,
                          label_smoothing: float = 0.0) -> Self:
        """The seeds' name of :meth:`cross_entropy` with its options (same semantics)."""
        return self.cross_entropy(class_tag, labels, reduction, ignore_index, label_smoothing)

    def linear_cross_entropy(self, weight: Tensor, labels: Sequence[int] | np.ndarray | Tensor,
                             reduction: str = "mean", ignore_index: int | None = None,
                             label_smoothing: float = 0.0) -> Self:
        """``cross_entropy(self . weight^T)`` as one op: self [row, shared], weight
        [class, shared] (shared tag last on both, class tag absent from self).

        The [row, class] logits exist only inside the op: kept for the backward,
        which turns them into their gradient in place and contracts it with the
        operands, so the logit gradient is never a second buffer. Same options as
        :meth:`cross_entropy`; "none" returns per-row losses tagged by the row tag.
        Differentiable in both operands; a second backward through one result
        raises LinearCrossEntropyBackwardConsumed.
        """
        row, _ = _check_linear(self, weight)
        ignore, smooth = _ce_options(reduction, ignore_index, label_smoothing)
        rows = self.shape[0]
        lab = index_node(self, labels, rows, "labels", ((row,), (rows,)))
        rec = FL.new_record("linear_ce", reuse=current_tracer() is not None)
        stats = emit("linear_ce", (self._node, weight._node, lab), rec=rec, ignore=ignore,
                     smooth=smooth, save=_needs_record(self, weight))
        return cast("Self", _finish_rows(self, stats, (row,), (rows,), reduction))

    def linear_cross_entropy_ext(self, weight: Tensor, labels: Sequence[int] | np.ndarray | Tensor,
                                 reduction: str = "mean", ignore_index: int | None = None,
                                 label_smoothing: float = 0.0) -> Self:
        """The seeds' name of :meth:`linear_cross_entropy` with its options."""
        return self.linear_cross_entropy(weight, labels, reduction, ignore_index,
                                         label_smoothing)

    def linear_distill(self, weight: Tensor, rows: Sequence[int] | np.ndarray | Tensor,
                       classes: Sequence[int] | np.ndarray | Tensor,
                       probs: Sequence[float] | np.ndarray | Tensor, reduction: str = "mean",
                       loss_scale: float = 1.0) -> Self:
        """Cross-entropy of ``self . weight^T`` against sparse soft targets, as one op.

        ``loss = reduce_i probs[i] (logsumexp(logits[rows[i]]) - logits[rows[i],
        classes[i]]) * loss_scale`` over the entries i; "mean" divides by the entry
        count (probs are used as given, never renormalized), "sum" does not. Only
        the unique rows named by ``rows`` are projected. Operands as
        :meth:`linear_cross_entropy`; differentiable in both; a second backward
        through one result raises LinearDistillBackwardConsumed.
        """
        _check_linear(self, weight)
        _reduction(reduction, ("mean", "sum"))
        scale = real_arg(loss_scale, "loss_scale")
        n = _count_of(rows, "rows")
        for data, what in ((classes, "classes"), (probs, "probs")):
            if _count_of(data, what) != n:
                raise InvalidShape(f"{what} holds {_count_of(data, what)} entries, rows {n}")
        rnode = index_node(self, rows, n, "rows")
        cnode = index_node(self, classes, n, "classes")
        pnode = _float_vector(self, probs, n, "probs")
        rec = FL.new_record("linear_distill", reuse=current_tracer() is not None)
        node = emit("linear_distill", (self._node, weight._node, rnode, cnode, pnode), rec=rec,
                    reduction=reduction, loss_scale=scale, save=_needs_record(self, weight))
        return cast("Self", result(self, (), node, DType.f32))

    def linear_distill_ext(self, weight: Tensor, rows: Sequence[int] | np.ndarray | Tensor,
                           classes: Sequence[int] | np.ndarray | Tensor,
                           probs: Sequence[float] | np.ndarray | Tensor,
                           reduction: str = "mean", loss_scale: float = 1.0) -> Self:
        """The seeds' name of :meth:`linear_distill` with its options."""
        return self.linear_distill(weight, rows, classes, probs, reduction, loss_scale)

    # -- composed losses -----------------------------------------------------------------

    def nll_loss(self, class_tag: str, labels: Sequence[int] | np.ndarray | Tensor,
                 reduction: str = "mean") -> Self:
        """Negative log-likelihood of log-probabilities ``self`` over ``class_tag``:
        ``-self[label]`` per position (torch.nn.functional.nll_loss; "mean" over the
        positions). Composed: the label's entry is selected (never multiplied by 0,
        so -inf log-probabilities of other classes stay harmless), summed, negated."""
        c = T.index(self.axis_tags, class_tag)
        _reduction(reduction)
        shape = self._node.shape
        k = shape[c]
        rest_shape = tuple(d for i, d in enumerate(shape) if i != c) if self.tag_count > 1 \
            else ()
        positions = math.prod(rest_shape)
        rest_tags = T.remove_tags(self.axis_tags, (class_tag,))
        lab = index_node(self, labels, positions, "labels", (rest_tags, rest_shape))
        # nothing here indexes with the labels: check them explicitly (eager and compiled)
        lab = emit("check_index", (self._node, lab), axis=c)
        # labels and the class iota viewed over the logits' shape
        rest_strides = iter(contiguous_strides(rest_shape or (1,)))
        lab_coeffs = tuple((0,) if i == c else (next(rest_strides),) for i in range(len(shape)))
        lab_b = emit("view", (lab,), shape=shape, coeffs=lab_coeffs, base=(0,))
        iota = _const_node(np.arange(k, dtype=np.int64), DType.i64)
        iota_b = emit("view", (iota,), shape=shape,
                      coeffs=tuple((1,) if i == c else (0,) for i in range(len(shape))), base=(0,))
        hit = emit("compare", (iota_b, lab_b), fn="eq")
        picked = emit("where", (hit, self._node, _fill_like(self._node, 0.0)))
        per = _unary("neg", emit("reduce", (picked,), fn="sum", axes=(c,), dtype=DType.f32))
        if reduction == "none":
            return cast("Self", result(self, rest_tags, per, DType.f32))
        axes = tuple(range(len(per.shape)))
        return cast("Self", result(self, (), emit("reduce", (per,), fn=reduction, axes=axes,
                                                  dtype=DType.f32), DType.f32))

    def mse_loss(self, target: Tensor, reduction: str = "mean") -> Self:
        """(self - target)^2, reduced ("mean" over every element). Differentiable in both."""
        _reduction(reduction)
        d = _bin("sub", self._node, _target(self, target))
        return cast("Self", _finish_elementwise(self, _bin("mul", d, d), reduction))

    def huber_loss(self, target: Tensor, delta: float = 1.0, reduction: str = "mean",
                   ) -> Self:
        """torch.nn.functional.huber_loss: 0.5 d^2 for |d| <= delta, delta (|d| - delta / 2)
        beyond (d = self - target). Differentiable in both operands."""
        _reduction(reduction)
        dv = real_arg(delta, "delta")
        if not dv > 0.0:
            raise InvalidShape(f"huber delta must be > 0, got {delta}")
        d = _bin("sub", self._node, _target(self, target))
        a = _unary("abs", d)
        q = _unary("clamp", a, (-math.inf, dv))  # min(|d|, delta)
        # q (|d| - q / 2): |d|^2 / 2 inside, delta (|d| - delta / 2) outside
        per = _bin("mul", q, _bin("sub", a, _scalar("mul", q, 0.5)))
        return cast("Self", _finish_elementwise(self, per, reduction))

    def bce_loss(self, target: Tensor, reduction: str = "mean", from_logits: bool = False,
                 ) -> Self:
        """Binary cross-entropy against ``target`` in [0, 1].

        ``from_logits``: self is a logit and the stable softplus(x) - x y form is used
        (gradient sigmoid(x) - y). Otherwise self is a probability clamped to
        [1e-7, 1 - 1e-7]: its gradient is 0 outside that interval (deliberately, where
        torch's is huge). Differentiable in both operands.
        """
        _reduction(reduction)
        y = _target(self, target)
        x = self._node
        if flag_arg(from_logits, "from_logits"):
            per = _bin("sub", _unary("softplus", x), _bin("mul", x, y))
        else:
            p = _unary("clamp", x, (BCE_EPS, 1.0 - BCE_EPS))
            lp = _unary("log", p)
            lq = _unary("log", _scalar("rsub", p, 1.0))
            # -(y log p + (1 - y) log(1 - p)) = -(lq + y (lp - lq))
            per = _unary("neg", _bin("add", lq, _bin("mul", y, _bin("sub", lp, lq))))
        return cast("Self", _finish_elementwise(self, per, reduction))

    def kl_div_loss(self, target: Tensor, reduction: str = "mean", log_target: bool = False,
                    ) -> Self:
        """torch.nn.functional.kl_div with ``self`` holding log-probabilities:
        target (log target - self), 0 where target is 0; with ``log_target`` the target
        is a log-probability: exp(target) (target - self). "mean" is the mean over
        every element (torch's "mean"; no "batchmean"), "sum" the divergence.
        Differentiable in both operands."""
        _reduction(reduction)
        t = _target(self, target)
        x = self._node
        if flag_arg(log_target, "log_target"):
            per = _bin("mul", _unary("exp", t), _bin("sub", t, x))
        else:
            zero = emit("compare", (t,), fn="eq", value=0.0)
            safe = emit("where", (zero, _fill_like(t, 1.0), t))  # log(1) = 0 where t = 0
            per = _bin("mul", t, _bin("sub", _unary("log", safe), x))
        return cast("Self", _finish_elementwise(self, per, reduction))

    def cosine_similarity(self, other: Tensor, tag: str, eps: float = 1e-8) -> Self:
        """torch.nn.functional.cosine_similarity over ``tag``: sum(x y) / max(|x| |y|, eps),
        ``tag`` reduced away, the other tags broadcast by name. Differentiable in both."""
        check_tensor(other, "other")
        T.index(self.axis_tags, tag)
        T.index(other.axis_tags, tag)
        e = real_arg(eps, "eps")
        if not e > 0.0:
            raise InvalidShape(f"cosine_similarity eps must be > 0, got {eps}")
        x = cast("F32Tensor", self)
        y = cast("F32Tensor", other)
        num = x.mul(y).sum(tag)
        # max(|x| |y|, eps) = sqrt(max(|x|^2 |y|^2, eps^2)): no 0 * inf in the gradient
        den = x.mul(x).sum(tag).mul(y.mul(y).sum(tag)).clamp_min(e * e).sqrt()
        return cast("Self", num.div(den))
