"""The convolution-family primitives: registry entries and VJP rules.

Windowed ops are primitives of their own (their kernels live in
``fucina/kernels/conv.py``); everything else in the family (the 1-D convs,
causal padding, transposed conv, upsampling, channel affine, relative shift)
is composed from these and the core primitives. All operate on channel-last
4-D values ``[B, H, W, C]``; a window attribute is
``(kh, kw, sh, sw, ph, pw, dh, dw)``.

- ``conv2d(x, w[, bias])``: ``[B, oH, oW, Cout]``; attrs ``window``,
  ``groups``, ``relu`` (fused epilogue, only recorded without gradients),
  ``prepared`` (Winograd planes built once, or None).
- ``conv2d_grad_input(g, w)``, ``conv2d_grad_weight(x, g)``: its VJP halves.
- ``unfold(x)``: patches ``[B, oH*oW, kh*kw, C]``; ``fold(cols)`` (attr ``hw``)
  is its exact adjoint, and each is the other's VJP.
- ``pool2d(x)`` (attr ``fn``: max/avg) and ``pool2d_grad(x, g)``.
"""

from __future__ import annotations

from typing import Any

from ..dtypes import DType
from ..kernels import conv as K
from ..runtime.raw import RawTensor
from .autodiff import rule
from .execute import emit
from .graph import Node
from .ops import OPS, Meta, OpDef


def _conv2d(ins: list[RawTensor], attrs: dict[str, Any]) -> Meta:
    x, w = ins[0], ins[1]
    oh, ow = K.out_hw(x.shape[1], x.shape[2], attrs["window"])
    return (x.shape[0], oh, ow, w.shape[0]), DType.f32


def _unfold(ins: list[RawTensor], attrs: dict[str, Any]) -> Meta:
    x = ins[0]
    win = attrs["window"]
    oh, ow = K.out_hw(x.shape[1], x.shape[2], win)
    return (x.shape[0], oh * ow, win[0] * win[1], x.shape[3]), DType.f32


def _fold(ins: list[RawTensor], attrs: dict[str, Any]) -> Meta:
    c = ins[0]
    h, w = attrs["hw"]
    return (c.shape[0], h, w, c.shape[3]), DType.f32


def _pool2d(ins: list[RawTensor], attrs: dict[str, Any]) -> Meta:
    x = ins[0]
    oh, ow = K.out_hw(x.shape[1], x.shape[2], attrs["window"])
    return (x.shape[0], oh, ow, x.shape[3]), DType.f32


def _given(key: str) -> Any:
    def infer(ins: list[RawTensor], attrs: dict[str, Any]) -> Meta:
        return tuple(attrs[key]), DType.f32
    return infer


OPS["conv2d"] = OpDef("conv2d", infer=_conv2d)
OPS["conv2d_grad_input"] = OpDef("conv2d_grad_input", infer=_given("in_shape"),
                                 differentiable=False)
OPS["conv2d_grad_weight"] = OpDef("conv2d_grad_weight", infer=_given("w_shape"),
                                  differentiable=False)
OPS["unfold"] = OpDef("unfold", infer=_unfold)
OPS["fold"] = OpDef("fold", infer=_fold)
OPS["pool2d"] = OpDef("pool2d", infer=_pool2d)
OPS["pool2d_grad"] = OpDef("pool2d_grad", infer=_given("in_shape"), differentiable=False)


def _common(n: Node) -> dict[str, Any]:
    return {"window": n.attrs["window"], "groups": n.attrs["groups"]}


@rule("conv2d")
def _conv2d_vjp(n: Node, g: Node) -> tuple[Node | None, ...]:
    x, w = n.inputs[0], n.inputs[1]
    if n.attrs.get("relu"):  # only recorded without grad; kept exact for completeness
        zero = emit("fill", (), shape=n.shape, dtype=DType.f32, value=0.0)
        g = emit("where", (emit("compare", (n,), fn="gt", value=0.0), g, zero))
    gx = emit("conv2d_grad_input", (g, w), in_shape=x.shape, **_common(n)) \
        if x.requires_grad else None
    gw = emit("conv2d_grad_weight", (x, g), w_shape=w.shape, **_common(n)) \
        if w.requires_grad else None
    if len(n.inputs) == 2:
        return gx, gw
    gb = emit("reduce", (g,), fn="sum", axes=(0, 1, 2), dtype=DType.f32) \
        if n.inputs[2].requires_grad else None
    return gx, gw, gb


@rule("unfold")
def _unfold_vjp(n: Node, g: Node) -> tuple[Node | None, ...]:
    x = n.inputs[0]
    return (emit("fold", (g,), hw=(x.shape[1], x.shape[2]), window=n.attrs["window"]),)


@rule("fold")
def _fold_vjp(n: Node, g: Node) -> tuple[Node | None, ...]:
    return (emit("unfold", (g,), window=n.attrs["window"]),)


@rule("pool2d")
def _pool2d_vjp(n: Node, g: Node) -> tuple[Node | None, ...]:
    x = n.inputs[0]
    return (emit("pool2d_grad", (x, g), in_shape=x.shape, fn=n.attrs["fn"],
                 window=n.attrs["window"]),)
