"""Fused-loss primitives: cross-entropy rows and the fused linear losses.

``ce_rows`` (logits, i64 labels) -> per-position ``[loss, sum, keep, shift]`` rows.
Composed from the elementwise primitives, cross-entropy materialized the
exponentials for its backward and read the logits five times; the primitive
reads them once forward (the row's second pass hits L2) and once backward,
where ``ce_rows_grad`` rebuilds the softmax from the saved row max and sum.
Measurements are in docs/ARCHITECTURE.md ("Primitives of the losses and
selection").

``linear_ce`` (x [rows, d], weight [classes, d], labels) computes the logits
inside the op and keeps them (not as an IR value) on a :class:`SavedLogits`
record; its VJP turns them into their gradient in place
(``linear_ce_panel``) and contracts that panel with the operands (two
``contract`` nodes), so no second [rows, classes] buffer ever exists. That
in-place consumption makes the record single-use, as in the reference
(:class:`~fucina.errors.LinearCrossEntropyBackwardConsumed`).

``linear_distill`` projects only the unique rows its soft targets name; the
count is data-dependent, so its gradient node returns dx and dweight packed
in one flat buffer that two ``strided`` views take apart.

Labels and target indices are checked by the IR's index checks
(``ir/checks.py``: at once in eager mode, as a program step under compile)
before any kernel reads them; the kernels check them once more as a guard.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..dtypes import DType
from ..errors import LinearCrossEntropyBackwardConsumed, LinearDistillBackwardConsumed
from ..kernels import losses as LK
from ..kernels.reference import kernel
from ..runtime.raw import RawTensor
from ..runtime.storage import POOL
from .autodiff import rule
from .checks import VALUE_CHECKS, axis_name
from .execute import emit
from .graph import Node
from .ops import OPS, Meta, OpDef
from .selection import check_indices, check_labels, rows_back, rows_last


def _sentinel(ignore: int | None) -> int:
    # Labels are checked to lie in [0, K) unless equal to ``ignore``: -1 never matches.
    return -1 if ignore is None else int(ignore)


# -- cross-entropy over a class axis --------------------------------------------------


def _ce_stats_meta(ins: list[RawTensor], attrs: dict[str, Any]) -> Meta:
    x = ins[0]
    return (x.numel // x.shape[attrs["axis"]], LK.STATS), DType.f32


OPS["ce_rows"] = OpDef("ce_rows", infer=_ce_stats_meta)
OPS["ce_rows_grad"] = OpDef("ce_rows_grad", infer=lambda ins, attrs: (ins[0].shape, DType.f32),
                            differentiable=False)


@kernel("ce_rows")
def _ce_rows(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """Per position: (loss, log-sum-exp, keep) with label smoothing and an ignored label."""
    x = rows_last(np.asarray(ins[0], dtype=np.float32), attrs["axis"])
    labels = check_indices(ins[1], x.shape[1], attrs["ignore"])
    stats = np.empty((x.shape[0], LK.STATS), np.float32)
    LK.ce_forward(x, labels, _sentinel(attrs["ignore"]), float(attrs["smooth"]), stats)
    return stats


@kernel("ce_rows_grad")
def _ce_rows_grad(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """d loss / d logits from the forward's stats and the per-position loss gradient."""
    logits, labels_in, stats, g = ins
    axis = attrs["axis"]
    x = rows_last(np.asarray(logits, dtype=np.float32), axis)
    labels = check_indices(labels_in, x.shape[1], attrs["ignore"])
    gp = np.ascontiguousarray(g[:, LK.STAT_LOSS], dtype=np.float32)
    dx = POOL.take(np.dtype(np.float32), x.size).reshape(x.shape)
    LK.ce_backward(x, labels, float(attrs["smooth"]), np.ascontiguousarray(stats), gp, dx)
    return rows_back(dx, logits.shape, axis) if axis != logits.ndim - 1 else \
        dx.reshape(logits.shape)


def _check_class_labels(inputs: Sequence[Node], attrs: dict[str, Any],
                        arrays: list[np.ndarray]) -> None:
    x, axis = inputs[0], attrs["axis"]
    check_labels(arrays[1], x.shape[axis], attrs["ignore"], axis_name(x, axis))


VALUE_CHECKS["ce_rows"] = _check_class_labels
VALUE_CHECKS["ce_rows_grad"] = _check_class_labels


@rule("ce_rows")
def _ce_rows_vjp(n: Node, g: Node) -> tuple[Node | None, ...]:
    x, labels = n.inputs
    a = n.attrs
    return (emit("ce_rows_grad", (x, labels, n, g), axis=a["axis"], ignore=a["ignore"],
                 smooth=a["smooth"]), None)


# -- the saved-logits record of the fused linear losses --------------------------------


class _Saved:
    """What one forward run keeps for its backward."""

    __slots__ = ("logits", "rows", "extra", "buffer")

    def __init__(self) -> None:
        self.logits: np.ndarray | None = None
        self.rows: tuple[np.ndarray, np.ndarray] | None = None  # the rows' shift and sum
        self.extra: Any = None
        self.buffer: np.ndarray | None = None


class SavedLogits:
    """Logits a fused linear loss keeps for its backward, which consumes them in place.

    A compiled program's record (``reuse``) keeps its buffer between runs, as
    programs keep their intermediates, and keeps it per thread: a program may
    run on several threads at once, and each run's forward and backward steps
    run on the run's thread. An eager record holds one forward's logits (its
    backward may run on any thread) and drops them once consumed.
    """

    __slots__ = ("reuse", "claimed", "error", "_one", "_local")

    def __init__(self, reuse: bool, error: type[Exception]):
        self.reuse = reuse
        self.claimed = False
        self.error = error
        self._one = _Saved()
        self._local = threading.local() if reuse else None

    def __repr__(self) -> str:  # what fast.ir() prints for the attribute
        return "saved-logits"

    def saved(self) -> _Saved:
        """This run's saved state."""
        if self._local is None:
            return self._one
        s = getattr(self._local, "saved", None)
        if s is None:
            s = self._local.saved = _Saved()
        return s

    def take(self, rows: int, cols: int) -> np.ndarray:
        """A [rows, cols] f32 buffer for the logits."""
        st = self.saved()
        count = rows * cols
        buf = st.buffer
        if buf is None or buf.size != count:
            buf = POOL.take(np.dtype(np.float32), count)
            if self.reuse:
                st.buffer = buf
        return buf.reshape(rows, cols)

    def keep(self, z: np.ndarray, save: bool) -> None:
        """Save ``z`` for the backward, or hand its buffer back."""
        if save:
            self.saved().logits = z
        elif not self.reuse:
            POOL.give(z.reshape(-1))

    def claim(self) -> None:
        """Mark the single backward this record allows (a second one raises)."""
        if self.claimed:
            raise self.error("this loss's backward already ran: its saved logits were "
                             "consumed in place (build the loss again for another backward)")
        self.claimed = True

    def consume(self) -> np.ndarray:
        """The saved logits, handed over to the backward."""
        st = self.saved()
        z = st.logits
        if z is None:
            raise self.error("the saved logits were already consumed")
        st.logits = None
        if not self.reuse:
            st.buffer = None
        return z


def new_record(kind: str, reuse: bool) -> SavedLogits:
    """A fresh record for ``linear_ce`` or ``linear_distill``."""
    err = LinearCrossEntropyBackwardConsumed if kind == "linear_ce" \
        else LinearDistillBackwardConsumed
    return SavedLogits(reuse, err)


# -- linear + cross-entropy ----------------------------------------------------------------


OPS["linear_ce"] = OpDef("linear_ce",
                         infer=lambda ins, attrs: ((ins[0].shape[0], LK.STATS), DType.f32))
OPS["linear_ce_panel"] = OpDef(
    "linear_ce_panel", infer=lambda ins, attrs: ((ins[0].shape[0], attrs["classes"]), DType.f32),
    differentiable=False)


@kernel("linear_ce")
def _linear_ce(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """Logits x . weight^T (kept on the record when saving), then cross-entropy rows."""
    x, w, labels_in = ins
    rec: SavedLogits = attrs["rec"]
    labels = check_indices(labels_in, w.shape[0], attrs["ignore"])
    z = rec.take(x.shape[0], w.shape[0])
    np.matmul(x, w.T, out=z)
    stats = np.empty((x.shape[0], LK.STATS), np.float32)
    LK.ce_forward(z, labels, _sentinel(attrs["ignore"]), float(attrs["smooth"]), stats)
    rec.keep(z, bool(attrs["save"]))
    return stats


@kernel("linear_ce_panel")
def _linear_ce_panel(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """The saved logits turned into d loss / d logits, in place."""
    stats, g, labels_in = ins
    rec: SavedLogits = attrs["rec"]
    z = rec.consume()
    labels = check_indices(labels_in, z.shape[1], attrs["ignore"])
    gp = np.ascontiguousarray(g[:, LK.STAT_LOSS], dtype=np.float32)
    shift = np.ascontiguousarray(stats[:, LK.STAT_SHIFT], dtype=np.float32)
    total = np.ascontiguousarray(stats[:, LK.STAT_SUM], dtype=np.float32)
    LK.softmax_panel_inplace(z, labels, _sentinel(attrs["ignore"]), float(attrs["smooth"]),
                             1.0, gp, shift, total)
    return z


def _check_linear_labels(inputs: Sequence[Node], attrs: dict[str, Any],
                         arrays: list[np.ndarray]) -> None:
    w = inputs[1]
    check_labels(arrays[2], w.shape[0], attrs["ignore"], axis_name(w, 0))


VALUE_CHECKS["linear_ce"] = _check_linear_labels


@rule("linear_ce")
def _linear_ce_vjp(n: Node, g: Node) -> tuple[Node | None, ...]:
    x, w, labels = n.inputs
    a = n.attrs
    a["rec"].claim()
    panel = emit("linear_ce_panel", (n, g, labels), rec=a["rec"], ignore=a["ignore"],
                 smooth=a["smooth"], classes=w.shape[0])
    # panel [row, class]; x [row, d]; w [class, d]
    dx = emit("contract", (panel, w), labels=((0, 1), (1, 2), (0, 2)), shape=x.shape,
              dtype=DType.f32) if x.requires_grad else None
    dw = emit("contract", (panel, x), labels=((0, 1), (0, 2), (1, 2)), shape=w.shape,
              dtype=DType.f32) if w.requires_grad else None
    return dx, dw, None


# -- linear + sparse soft-target distillation ------------------------------------------------


def _distill_grad_meta(ins: list[RawTensor], attrs: dict[str, Any]) -> Meta:
    n = attrs["x_shape"][0] * attrs["x_shape"][1] if attrs["want_x"] else 0
    n += attrs["w_shape"][0] * attrs["w_shape"][1] if attrs["want_w"] else 0
    return (n,), DType.f32


OPS["linear_distill"] = OpDef("linear_distill", infer=lambda ins, attrs: ((1,), DType.f32))
OPS["linear_distill_grad"] = OpDef("linear_distill_grad", infer=_distill_grad_meta,
                                   differentiable=False)


@kernel("linear_distill")
def _linear_distill(attrs: dict[str, Any], ins: list[np.ndarray], out: DType) -> np.ndarray:
    """sum_i probs_i (lse(row_i) - logit(row_i, class_i)), projecting unique rows only."""
    x, w, rows_in, classes_in, probs_in = ins
    rec: SavedLogits = attrs["rec"]
    rows = check_indices(rows_in, x.shape[0])
    classes = check_indices(classes_in, w.shape[0])
    probs = np.ascontiguousarray(probs_in, dtype=np.float32).reshape(-1)
    uniq, inv = np.unique(rows, return_inverse=True)
    z = rec.take(uniq.size, w.shape[0])
    np.matmul(x[uniq], w.T, out=z)
    shift = np.empty(uniq.size, np.float32)
    sums = np.empty(uniq.size, np.float32)
    LK.shift_sum_rows(z, shift, sums)
    picked = z[inv, classes]
    # lse - logit as log(sum) + (shift - logit): no absolute log-sum-exp rounded to f32
    gap = np.log(sums.astype(np.float64))[inv] + (shift[inv].astype(np.float64) - picked)
    total = float(np.dot(probs.astype(np.float64), gap))
    if attrs["reduction"] == "mean":
        total /= probs.size
    if attrs["save"]:
        st = rec.saved()
        st.rows = (shift, sums)
        st.extra = (uniq, inv, classes, probs)
    rec.keep(z, bool(attrs["save"]))
    return np.array([total * attrs["loss_scale"]], np.float32)


@kernel("linear_distill_grad")
def _linear_distill_grad(attrs: dict[str, Any], ins: list[np.ndarray], out: DType,
                         ) -> np.ndarray:
    """dx and dweight packed flat ([x rows * d] then [classes * d]; either may be absent)."""
    x, w, _, g = ins
    rec: SavedLogits = attrs["rec"]
    st = rec.saved()
    z = rec.consume()
    uniq, inv, classes, probs = st.extra
    assert st.rows is not None  # saved with the logits
    shift, sums = st.rows
    coef = float(g.reshape(-1)[0]) * attrs["loss_scale"]
    if attrs["reduction"] == "mean":
        coef /= probs.size
    # d/dz_u = coef (softmax(z_u) * mass_u - sum_{i in u} probs_i onehot(class_i))
    mass = np.bincount(inv, weights=probs.astype(np.float64), minlength=uniq.size)
    LK.scaled_softmax_inplace(z, shift, sums, (coef * mass).astype(np.float32))
    np.add.at(z, (inv, classes), (-coef * probs).astype(np.float32))
    st.rows = st.extra = None
    parts = []
    if attrs["want_x"]:
        dx = np.zeros(x.shape, np.float32)
        dx[uniq] = z @ w
        parts.append(dx.reshape(-1))
    if attrs["want_w"]:
        parts.append((z.T @ np.asarray(x[uniq], dtype=np.float32)).reshape(-1))
    return np.concatenate(parts) if len(parts) > 1 else parts[0]


def _check_distill_indices(inputs: Sequence[Node], attrs: dict[str, Any],
                           arrays: list[np.ndarray]) -> None:
    x, w = inputs[0], inputs[1]
    check_labels(arrays[2], x.shape[0], None, axis_name(x, 0))
    check_labels(arrays[3], w.shape[0], None, axis_name(w, 0))


VALUE_CHECKS["linear_distill"] = _check_distill_indices


@rule("linear_distill")
def _linear_distill_vjp(n: Node, g: Node) -> tuple[Node | None, ...]:
    x, w = n.inputs[:2]
    a = n.attrs
    a["rec"].claim()
    want_x, want_w = x.requires_grad, w.requires_grad
    packed = emit("linear_distill_grad", (x, w, n, g), rec=a["rec"], want_x=want_x,
                  want_w=want_w, x_shape=x.shape, w_shape=w.shape, reduction=a["reduction"],
                  loss_scale=a["loss_scale"])
    d = x.shape[1]
    dx = emit("strided", (packed,), shape=x.shape, strides=(d, 1), offset=0) \
        if want_x else None
    off = x.shape[0] * d if want_x else 0
    dw = emit("strided", (packed,), shape=w.shape, strides=(d, 1), offset=off) \
        if want_w else None
    return dx, dw, None, None, None
