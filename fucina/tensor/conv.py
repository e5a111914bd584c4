"""Convolution and channel-last vision ops (REFERENCE §4.14) as one mixin class.

Images are channel-last: the trailing axes of ``x`` are ``(H, W, C)`` (the 1-D
family: ``(time, channel)``), and any leading axes are batch axes that keep
their tags. Windowed work records the primitives of ``fucina.ir.conv``
(conv2d, unfold/fold, pool2d); the rest composes core primitives: the 1-D
convs are conv2d over a height-1 image with the weight viewed into
``[out, 1, tap, in]``, causal convs pad or prepend the carried ``state``,
``conv_transpose1d`` is a GEMM then ``fold``, ``upsample2x_nearest`` a
broadcast view, ``relpos_shift`` an affine view, ``channel_affine`` two
broadcast pointwise ops.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import tags as T
from ..dtypes import DType
from ..errors import (
    Deinitialized,
    GradientPreparedConv2dUnsupported,
    InvalidDataLength,
    InvalidShape,
    ShapeMismatch,
    TagError,
)
from ..ir import conv as _prims  # noqa: F401 - registers the conv primitives and rules
from ..ir.execute import emit
from ..ir.graph import Node, leaf
from ..kernels import conv as K
from ..kernels.conv import PreparedConvWeights
from ..runtime.gradmode import is_grad_enabled, no_grad
from ..runtime.raw import MAX_ELEMENTS, MAX_ELEMENTS_TEXT, RawTensor
from .base import Tensor, check_tensor, result, same_ctx
from .contract import contract_nodes

__all__ = ["ConvOps", "PreparedConvWeights"]

Pair = int | tuple[int, int]


# -- argument checks -----------------------------------------------------------------------


def _int(v: Any, what: str, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{what} must be an int, got {v!r}")
    v = int(v)
    if v < lo:
        raise ValueError(f"{what} must be >= {lo}, got {v}")
    if v > MAX_ELEMENTS:  # (no window reaches further than a tensor holds elements)
        raise ValueError(f"{what} must be <= {MAX_ELEMENTS_TEXT}, got {v}")
    return v


def _pair(v: Any, what: str, lo: int) -> tuple[int, int]:
    """An int or an (h, w) pair of ints, each >= lo."""
    if isinstance(v, (tuple, list)):
        if len(v) != 2:
            raise ValueError(f"{what} takes (h, w), got {v!r}")
        return _int(v[0], f"{what}[0]", lo), _int(v[1], f"{what}[1]", lo)
    x = _int(v, what, lo)
    return x, x


def _f32_operand(self: Any, x: Any, what: str) -> Any:
    check_tensor(x, what)
    same_ctx(self, x)
    if x.dtype is not DType.f32:
        raise TagError(f"{what} must be an f32 tensor, got {x.dtype.value}")
    return x


def _wants_grad(*xs: Any) -> bool:
    return is_grad_enabled() and any(x is not None and x.requires_grad for x in xs)


# -- layout helpers: every primitive sees [B, H, W, C] ------------------------------------------


def _reshape(node: Node, shape: tuple[int, ...]) -> Node:
    if tuple(node.shape) == tuple(shape):
        return node
    if not node.value.is_contiguous():
        node = emit("copy", (node,))
    return emit("reshape", (node,), shape=tuple(shape))


def _as4d(node: Node, n_window: int) -> tuple[Node, tuple[int, ...]]:
    """View ``[*lead, *window]`` (window = the last ``n_window`` axes, padded with
    leading 1s to 3) as ``[B, H, W, C]``; returns the node and the lead shape."""
    shape = tuple(node.shape)
    lead, win = shape[:len(shape) - n_window], shape[len(shape) - n_window:]
    win = (1,) * (3 - n_window) + win
    b = math.prod(lead) if lead else 1
    return _reshape(node, (b, *win)), lead


def _weight_view(w: Node, perm: tuple[int, ...], shape: tuple[int, ...]) -> Node:
    """A zero-copy view of ``w`` with axis k of the result reading w's axis perm[k]
    (-1: an inserted size-1 axis)."""
    r = len(w.shape)
    coeffs = tuple(tuple(1 if j == p else 0 for j in range(r)) for p in perm)
    return emit("view", (w,), shape=shape, coeffs=coeffs, base=(0,) * r)


def _bcast_channel(v: Node, shape: tuple[int, ...]) -> Node:
    """A rank-1 ``[C]`` vector viewed over ``shape`` (C innermost), stride 0 elsewhere."""
    r = len(shape)
    coeffs = tuple((1,) if k == r - 1 else (0,) for k in range(r))
    return emit("view", (v,), shape=shape, coeffs=coeffs, base=(0,))


def _conv_node(x4: Node, w4: Node, bias: Node | None, win: K.Window, groups: int,
               relu: bool = False, prepared: PreparedConvWeights | None = None) -> Node:
    K.check_conv(x4.shape, w4.shape, win, groups)
    ins = (x4, w4) if bias is None else (x4, w4, bias)
    attrs: dict[str, Any] = {"window": win, "groups": groups}
    if relu:
        attrs["relu"] = True
    if prepared is not None and prepared.planes is not None:
        attrs["prepared"] = prepared
    return emit("conv2d", ins, **attrs)


def _state_rows(self: Any, state: Any, lead: tuple[int, ...], rows: int, cin: int) -> Node:
    """The carried input rows as a no-grad ``[B, 1, rows, C]`` node."""
    b = math.prod(lead) if lead else 1
    n = b * rows * cin
    if isinstance(state, Tensor):
        _f32_operand(self, state, "state")
        if state._node.value.numel != n:
            raise InvalidDataLength(f"state holds {state._node.value.numel} values; "
                                    f"{rows} rows x {cin} channels need {n}")
        with no_grad():  # no gradient flows into the carried state
            return _reshape(state._node, (b, 1, rows, cin))
    try:
        arr = np.asarray(state, dtype=np.float32).reshape(-1)
    except (TypeError, ValueError, OverflowError):  # (an int beyond float)
        raise TypeError(f"state must be a tensor or a sequence of numbers, got "
                        f"{type(state).__name__}") from None
    if arr.size != n:
        raise InvalidDataLength(f"state holds {arr.size} values; {rows} rows x {cin} "
                                f"channels need {n}")
    return leaf(RawTensor.from_array(DType.f32, arr, (b, 1, rows, cin)), None, False)


# -- the mixin --------------------------------------------------------------------------------


class ConvOps(Tensor):
    """Convolution, pooling, patch and channel-last vision ops (f32, differentiable)."""

    __slots__ = ()

    # -- 2-D family ----------------------------------------------------------------------

    def conv2d(self, weight: Tensor, bias: Tensor | None, stride: Pair, padding: Pair,
               groups: int, out_tags: Sequence[str]) -> Tensor:
        """Channel-last 2-D convolution (torch ``Conv2d`` cross-correlation).

        ``self`` is ``[..., H, W, C]`` (leading axes are batch), ``weight``
        rank-4 ``[Cout, kH, kW, C/groups]``, ``bias`` None or rank-1 ``[Cout]``;
        ``stride``/``padding`` are ints or ``(h, w)`` pairs. The result is
        ``[..., oH, oW, Cout]`` with the window axes tagged ``out_tags``.
        Differentiable in every tensor operand.
        """
        return _conv2d(self, weight, bias, stride, padding, groups, out_tags, relu=False)

    def conv2d_relu(self, weight: Tensor, bias: Tensor | None, stride: Pair, padding: Pair,
                    groups: int, out_tags: Sequence[str]) -> Tensor:
        """``conv2d`` then ``relu``, the relu fused into the conv epilogue when no operand
        requires grad (same values either way)."""
        return _conv2d(self, weight, bias, stride, padding, groups, out_tags, relu=True)

    def prepare_conv2d_weights(self) -> PreparedConvWeights:
        """Build this conv2d weight's Winograd planes once (``PreparedConvWeights``).

        ``self`` is a rank-4 ``[Cout, kH, kW, Cin]`` weight. A weight that can never
        take the Winograd route returns ``PreparedConvWeights.empty``. Raises
        ``GradientPreparedConv2dUnsupported`` on a weight that requires grad.
        """
        if self.tag_count != 4:
            raise TagError(f"prepare_conv2d_weights needs a rank-4 weight, got "
                           f"{self.axis_tags}")
        if self.requires_grad:
            raise GradientPreparedConv2dUnsupported(
                "prepared conv weights live outside the graph; use conv2d to train")
        shape = tuple(self.shape)
        if not K.winograd_eligible(shape, (3, 3, 1, 1, 0, 0, 1, 1), 1):
            return PreparedConvWeights.empty
        raw = self._node.value
        if raw.is_symbolic:
            raise TypeError("prepare_conv2d_weights runs at load time, outside compile")
        return PreparedConvWeights.build(raw.array())

    def conv2d_prepared(self, weight: Tensor, prepared: PreparedConvWeights,
                        bias: Tensor | None, stride: Pair, padding: Pair, groups: int,
                        out_tags: Sequence[str]) -> Tensor:
        """No-grad ``conv2d`` using ``prepared`` planes on the Winograd route (the same
        values as ``conv2d``). Raises ``GradientPreparedConv2dUnsupported`` when an
        operand requires grad."""
        return _conv2d(self, weight, bias, stride, padding, groups, out_tags, relu=False,
                       prepared=prepared)

    def conv2d_prepared_relu(self, weight: Tensor, prepared: PreparedConvWeights,
                             bias: Tensor | None, stride: Pair, padding: Pair, groups: int,
                             out_tags: Sequence[str]) -> Tensor:
        """``conv2d_prepared`` with the relu fused into the conv epilogue."""
        return _conv2d(self, weight, bias, stride, padding, groups, out_tags, relu=True,
                       prepared=prepared)

    def max_pool2d(self, kernel: Pair, stride: Pair, padding: Pair) -> Tensor:
        """Max over ``kernel`` windows of ``[..., H, W, C]``; pad taps read as -inf (the
        result keeps this tensor's tags). NaN propagates; the gradient goes to the
        first maximum of each window."""
        return _pool(self, "max", kernel, stride, padding)

    def avg_pool2d(self, kernel: Pair, stride: Pair, padding: Pair) -> Tensor:
        """Mean over the valid (non-pad) taps of each window (``count_include_pad=0``)."""
        return _pool(self, "avg", kernel, stride, padding)

    def upsample2x_nearest(self) -> Tensor:
        """``[..., H, W, C] -> [..., 2H, 2W, C]``, each pixel repeated 2x2 (VJP: 2x2 sum)."""
        T.check_window_rank(self.axis_tags, 3, "upsample2x_nearest")
        x4, lead = _as4d(self._node, 3)
        b, h, w, c = x4.shape
        rep = emit("view", (x4,), shape=(b, h, 2, w, 2, c),
                   coeffs=((1, 0, 0, 0), (0, 1, 0, 0), (0, 0, 0, 0), (0, 0, 1, 0),
                           (0, 0, 0, 0), (0, 0, 0, 1)), base=(0, 0, 0, 0))
        up = emit("reshape", (emit("copy", (rep,)),), shape=(*lead, 2 * h, 2 * w, c))
        return result(self, self.axis_tags, up)

    def unfold(self, kernel: Pair, stride: Pair, padding: Pair,
               out_tags: Sequence[str]) -> Tensor:
        """Patch extraction (im2col, torch ``Unfold`` channel-last).

        ``[..., H, W, C] -> [..., oH*oW, kH*kW*C]`` tagged ``out_tags`` (patch
        axis, element axis); patch row ``oy*oW + ox`` holds its window's taps in
        ``(ky, kx, c)`` order, channel fastest; pad taps read 0. The VJP is ``fold``.
        """
        tags = T.window_result(self.axis_tags, 3, out_tags, 2, "unfold")
        win = _window(kernel, stride, padding)
        x4, lead = _as4d(self._node, 3)
        K.check_pool(x4.shape, win)
        cols = emit("unfold", (x4,), window=win)
        _, n, kk, c = cols.shape
        return result(self, tags, _reshape(cols, (*lead, n, kk * c)))

    def fold(self, output_size: Pair, kernel: Pair, stride: Pair, padding: Pair,
             out_tags: Sequence[str]) -> Tensor:
        """The adjoint of ``unfold`` (torch ``Fold``): scatter-add ``[..., oH*oW,
        kH*kW*C]`` patches into ``[..., H, W, C]`` tagged ``out_tags``. Overlapping taps
        accumulate and pad taps drop; C is the element width over kH*kW."""
        tags = T.window_result(self.axis_tags, 2, out_tags, 3, "fold")
        h, w = _pair(output_size, "output_size", 1)
        win = _window(kernel, stride, padding)
        kh, kw = win[0], win[1]
        shape = tuple(self.shape)
        lead, (n, e) = shape[:-2], shape[-2:]
        if e % (kh * kw):
            raise ShapeMismatch(f"fold: patch width {e} is not a multiple of the "
                                f"{kh}x{kw} kernel")
        c = e // (kh * kw)
        oh, ow = K.check_pool((1, h, w, c), win)
        if n != oh * ow:
            raise ShapeMismatch(f"fold: {n} patch rows, but a {h}x{w} image with window "
                                f"{win[:6]} has {oh}x{ow} = {oh * ow} patches")
        b = math.prod(lead) if lead else 1
        cols = _reshape(self._node, (b, n, kh * kw, c))
        img = emit("fold", (cols,), hw=(h, w), window=win)
        return result(self, tags, _reshape(img, (*lead, h, w, c)))

    def channel_affine(self, scale: Tensor, shift: Tensor) -> Tensor:
        """``x * scale[c] + shift[c]`` over the innermost (channel) axis (frozen-stats
        batch norm); ``scale``/``shift`` rank-1 ``[C]``. Differentiable in all three."""
        T.check_window_rank(self.axis_tags, 1, "channel_affine")
        c = self.shape[-1]
        parts = []
        for v, what in ((scale, "scale"), (shift, "shift")):
            _f32_operand(self, v, what)
            if v.tag_count != 1:
                raise TagError(f"channel_affine {what} must be rank-1 [C], got {v.axis_tags}")
            if v.shape[0] != c:
                raise ShapeMismatch(f"channel_affine {what} has {v.shape[0]} entries; the "
                                    f"channel axis {self.axis_tags[-1]!r} has {c}")
            parts.append(_bcast_channel(v._node, tuple(self.shape)))
        y = emit("binary", (self._node, parts[0]), fn="mul")
        return result(self, self.axis_tags, emit("binary", (y, parts[1]), fn="add"))

    def relpos_shift(self, t_k: int, out_tags: Sequence[str]) -> Tensor:
        """Transformer-XL relative shift: ``[..., H, Tq, P] -> [..., H, Tq, Tk]`` with
        ``out[h, q, j] = self[h, q, j + (Tq - 1) - q]`` (needs ``P >= Tk + Tq - 1``).
        A zero-copy view; its VJP scatters back."""
        tags = T.window_result(self.axis_tags, 3, out_tags, 3, "relpos_shift")
        tk = _int(t_k, "t_k", 1)
        node = self._node
        shape = tuple(node.shape)
        tq, p = shape[-2], shape[-1]
        if p < tk + tq - 1:
            raise ShapeMismatch(f"relpos_shift: position axis has {p} entries; t_k={tk} with "
                                f"{tq} queries needs {tk + tq - 1}")
        st = node.value.strides
        if st[-2] < st[-1]:  # keep the shifted view's strides non-negative
            node = emit("copy", (node,))
        r = len(shape)
        coeffs = [tuple(1 if j == k else 0 for j in range(r)) for k in range(r - 2)]
        coeffs.append(tuple(1 if j == r - 2 else (-1 if j == r - 1 else 0) for j in range(r)))
        coeffs.append(tuple(1 if j == r - 1 else 0 for j in range(r)))
        base = (0,) * (r - 1) + (tq - 1,)
        return result(self, tags, emit("view", (node,), shape=(*shape[:-1], tk),
                                       coeffs=tuple(coeffs), base=base))

    # -- 1-D family ------------------------------------------------------------------------

    def conv1d(self, time_tag: str, in_tag: str, tap_tag: str, out_tag: str, weight: Tensor,
               stride: int = 1, padding: int = 0, dilation: int = 1,
               groups: int = 1) -> Tensor:
        """torch ``Conv1d`` over ``[..., time, in]`` with ``weight`` tagged ``(tap_tag,
        in_tag, out_tag)`` stored ``[tap, in/groups, out]``; the result is
        ``[..., t_out, out]`` tagged ``(..., time_tag, out_tag)``. No bias (add it)."""
        tags = T.conv1d_result(self.axis_tags, time_tag, in_tag, out_tag, "conv1d")
        _f32_operand(self, weight, "weight")
        T.check_exact(weight.axis_tags, (tap_tag, in_tag, out_tag), "conv1d weight")
        s = _int(stride, "stride", 1)
        p = _int(padding, "padding", 0)
        d = _int(dilation, "dilation", 1)
        gr = _int(groups, "groups", 1)
        x4, lead = _as4d(self._node, 2)
        return result(self, tags, _conv1d_node(x4, lead, weight, s, p, d, gr))

    def causal_conv1d(self, time_tag: str, in_tag: str, tap_tag: str, out_tag: str,
                      weight: Tensor, dilation: int = 1, state: Any = None) -> Tensor:
        """Causal dilated conv over ``[..., time, in]`` (tap ``taps-1`` is the newest
        sample); ``weight`` ``(tap_tag, in_tag, out_tag)``. ``state`` (optional, no
        gradient) is the flat array (or tensor) of the ``dilation*(taps-1)`` input rows
        before ``x``, oldest first; absent, those rows read as zeros."""
        tags = T.conv1d_result(self.axis_tags, time_tag, in_tag, out_tag, "causal_conv1d")
        _f32_operand(self, weight, "weight")
        T.check_exact(weight.axis_tags, (tap_tag, in_tag, out_tag), "causal_conv1d weight")
        return result(self, tags, _causal(self, weight, dilation, 1, state))

    def grouped_causal_conv1d(self, time_tag: str, in_tag: str, tap_tag: str,
                              in_per_group_tag: str, out_tag: str, weight: Tensor,
                              dilation: int, groups: int, state: Any = None) -> Tensor:
        """``causal_conv1d`` with ``groups`` channel groups; ``weight`` is tagged
        ``(tap_tag, in_per_group_tag, out_tag)`` stored ``[tap, in/groups, out]``."""
        tags = T.conv1d_result(self.axis_tags, time_tag, in_tag, out_tag,
                               "grouped_causal_conv1d")
        _f32_operand(self, weight, "weight")
        T.check_exact(weight.axis_tags, (tap_tag, in_per_group_tag, out_tag),
                      "grouped_causal_conv1d weight")
        return result(self, tags, _causal(self, weight, dilation,
                                          _int(groups, "groups", 1), state))

    def causal_depthwise_conv1d(self, time_tag: str, channel_tag: str, tap_tag: str,
                                kernel: Tensor, dilation: int = 1, state: Any = None
                                ) -> Tensor:
        """Depthwise causal FIR over ``[..., time, channel]``:
        ``y[t, c] = sum_k x[t - dilation*(taps-1-k), c] * kernel[c, k]`` with ``kernel``
        tagged ``(channel_tag, tap_tag)``; ``state`` as in ``causal_conv1d``."""
        T.check_trailing(self.axis_tags, (time_tag, channel_tag), "causal_depthwise_conv1d")
        _f32_operand(self, kernel, "kernel")
        T.check_exact(kernel.axis_tags, (channel_tag, tap_tag), "causal_depthwise_conv1d kernel")
        c = self.shape[-1]
        if kernel.shape[0] != c:
            raise ShapeMismatch(f"kernel has {kernel.shape[0]} channels, input has {c}")
        taps = kernel.shape[1]
        w4 = _weight_view(kernel._node, (0, -1, 1, -1), (c, 1, taps, 1))
        return result(self, self.axis_tags, _causal_node(self, w4, dilation, c, state))

    def conv_transpose1d(self, time_tag: str, in_tag: str, kout_tag: str, out_tag: str,
                         weight2: Tensor, bias: Tensor | None, out_channels: int, taps: int,
                         stride: int = 1, padding: int = 0, output_pad: int = 0) -> Tensor:
        """Transposed conv over ``[..., time, in]`` as GEMM + col2im (ggml's lowering).

        ``weight2`` is the repacked ``[taps*out, in]`` matrix tagged ``(kout_tag,
        in_tag)`` (row ``oc*taps + k``); ``bias`` None or ``[out]`` tagged
        ``(out_tag,)``. ``t_out = (T-1)*stride - 2*padding + taps + output_pad``;
        the last ``output_pad`` rows hold only the bias (ggml's convention).
        Differentiable in the input, ``weight2`` (its packed layout) and ``bias``.
        """
        tags = T.conv1d_result(self.axis_tags, time_tag, in_tag, out_tag, "conv_transpose1d")
        _f32_operand(self, weight2, "weight2")
        T.check_exact(weight2.axis_tags, (kout_tag, in_tag), "conv_transpose1d weight2")
        oc = _int(out_channels, "out_channels", 1)
        k = _int(taps, "taps", 1)
        s = _int(stride, "stride", 1)
        p = _int(padding, "padding", 0)
        op = _int(output_pad, "output_pad", 0)
        t, cin = self.shape[-2], self.shape[-1]
        if tuple(weight2.shape) != (k * oc, cin):
            raise ShapeMismatch(f"weight2 is {tuple(weight2.shape)}; taps={k}, "
                                f"out_channels={oc}, in={cin} need {(k * oc, cin)}")
        if bias is not None:
            _f32_operand(self, bias, "bias")
            T.check_exact(bias.axis_tags, (out_tag,), "conv_transpose1d bias")
            if bias.shape[0] != oc:
                raise ShapeMismatch(f"bias has {bias.shape[0]} entries, out_channels={oc}")
        full = (t - 1) * s - 2 * p + k
        if full < 1:
            raise ShapeMismatch(f"conv_transpose1d: {t} steps with stride {s}, padding {p}, "
                                f"{k} taps leave no output")
        lead = tuple(self.shape[:-2])
        cols_tags = (*self.axis_tags[:-1], kout_tag)
        cols = contract_nodes(self, self._node, self.axis_tags, weight2, weight2._node,
                              weight2.axis_tags, cols_tags, DType.f32)
        b = math.prod(lead) if lead else 1
        cols = _reshape(cols, (b, t, oc, k))
        cols = _weight_view(cols, (0, 1, 3, 2), (b, t, k, oc))  # taps before channels
        y = emit("fold", (cols,), hw=(1, full), window=(1, k, 1, s, 0, p, 1, 1))
        if op:
            y = emit("pad", (y,), axis=2, before=0, after=op, value=0.0)
        if bias is not None:
            y = emit("binary", (y, _bcast_channel(bias._node, tuple(y.shape))), fn="add")
        return result(self, tags, _reshape(y, (*lead, full + op, oc)))


# -- shared bodies --------------------------------------------------------------------------------


def _window(kernel: Pair, stride: Pair, padding: Pair) -> K.Window:
    kh, kw = _pair(kernel, "kernel", 1)
    sh, sw = _pair(stride, "stride", 1)
    ph, pw = _pair(padding, "padding", 0)
    return (kh, kw, sh, sw, ph, pw, 1, 1)


def _conv2d(self: Any, weight: Any, bias: Any, stride: Pair, padding: Pair, groups: int,
            out_tags: Sequence[str], relu: bool,
            prepared: PreparedConvWeights | None = None) -> Any:
    op = "conv2d" + ("_prepared" if prepared is not None else "") + ("_relu" if relu else "")
    tags = T.window_result(self.axis_tags, 3, out_tags, 3, op)
    _f32_operand(self, weight, "weight")
    if weight.tag_count != 4:
        raise TagError(f"{op} weight must be rank-4 [Cout, kH, kW, Cin/groups], got "
                       f"{weight.axis_tags}")
    if bias is not None:
        _f32_operand(self, bias, "bias")
        if bias.tag_count != 1:
            raise TagError(f"{op} bias must be rank-1 [Cout], got {bias.axis_tags}")
        if bias.shape[0] != weight.shape[0]:
            raise ShapeMismatch(f"{op} bias has {bias.shape[0]} entries, the weight has "
                                f"{weight.shape[0]} output channels")
    grad = _wants_grad(self, weight, bias)
    if prepared is not None:
        if not isinstance(prepared, PreparedConvWeights):
            raise TypeError(f"prepared must be a PreparedConvWeights, got "
                            f"{type(prepared).__name__}")
        if grad:
            raise GradientPreparedConv2dUnsupported(
                f"{op} is inference-only; use conv2d for operands that require grad")
        if prepared._released:
            raise Deinitialized("the prepared conv weights were deinit'ed")
        if prepared.planes is not None and prepared.weight_shape != tuple(weight.shape):
            raise ShapeMismatch(f"prepared planes belong to a weight of shape "
                                f"{prepared.weight_shape}, not {tuple(weight.shape)}")
    kh, kw = weight.shape[1], weight.shape[2]
    sh, sw = _pair(stride, "stride", 1)
    ph, pw = _pair(padding, "padding", 0)
    gr = _int(groups, "groups", 1)
    win = (kh, kw, sh, sw, ph, pw, 1, 1)
    x4, lead = _as4d(self._node, 3)
    b = bias._node if bias is not None else None
    node = _conv_node(x4, weight._node, b, win, gr, relu=relu and not grad, prepared=prepared)
    if relu and grad:
        node = emit("unary", (node,), fn="relu")
    return result(self, tags, _reshape(node, (*lead, *node.shape[1:])))


def _pool(self: Any, fn: str, kernel: Pair, stride: Pair, padding: Pair) -> Any:
    op = f"{fn}_pool2d"
    T.check_window_rank(self.axis_tags, 3, op)
    win = _window(kernel, stride, padding)
    if win[4] >= win[0] or win[5] >= win[1]:
        raise ValueError(f"{op}: padding {win[4:6]} must be smaller than the kernel "
                         f"{win[:2]} (every window needs a real tap)")
    x4, lead = _as4d(self._node, 3)
    K.check_pool(x4.shape, win)
    y = emit("pool2d", (x4,), fn=fn, window=win)
    return result(self, self.axis_tags, _reshape(y, (*lead, *y.shape[1:])))


def _conv1d_node(x4: Node, lead: tuple[int, ...], weight: Any, s: int, p: int, d: int,
                 groups: int) -> Node:
    taps, cg, out = weight.shape
    w4 = _weight_view(weight._node, (2, -1, 0, 1), (out, 1, taps, cg))
    y = _conv_node(x4, w4, None, (1, taps, 1, s, 0, p, 1, d), groups)
    return _reshape(y, (*lead, y.shape[2], out))


def _causal(self: Any, weight: Any, dilation: int, groups: int, state: Any) -> Node:
    taps, cg, out = weight.shape
    w4 = _weight_view(weight._node, (2, -1, 0, 1), (out, 1, taps, cg))
    return _causal_node(self, w4, dilation, groups, state)


def _causal_node(self: Any, w4: Node, dilation: int, groups: int, state: Any) -> Node:
    d = _int(dilation, "dilation", 1)
    taps = w4.shape[2]
    x4, lead = _as4d(self._node, 2)
    cin = x4.shape[3]
    rows = d * (taps - 1)
    if rows * math.prod(x4.shape[:2] + x4.shape[3:]) > MAX_ELEMENTS - x4.value.numel:
        raise InvalidShape(f"causal conv: dilation {d} x {taps - 1} taps makes {rows} "
                           f"padding rows, a tensor larger than {MAX_ELEMENTS_TEXT} elements")
    if rows:
        if state is None:
            x4 = emit("pad", (x4,), axis=2, before=rows, after=0, value=0.0)
        else:
            x4 = emit("concat", (_state_rows(self, state, lead, rows, cin), x4), axis=2)
    elif state is not None and np.size(np.asarray(
            state._node.value.numel if isinstance(state, Tensor) else state)) != 0:
        raise InvalidDataLength("a one-tap causal conv carries no state rows; pass None")
    y = _conv_node(x4, w4, None, (1, taps, 1, 1, 0, 0, 1, d), groups)
    return _reshape(y, (*lead, y.shape[2], w4.shape[0]))
