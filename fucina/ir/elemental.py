"""``elemental``: an elementwise primitive running a user scalar function.

``elemental(x0, x1, ...; fn, params)`` applies the registered function ``fn``
(:mod:`fucina.kernels.user_fns`) to same-shaped f32 operands and runtime
``params``; the fuser renders it as a call inside a generated kernel, so it
fuses like any built-in elementwise op. Its VJP is one more ``elemental``
node per operand that needs a gradient, running the op's backward on
``(*operands, output, output gradient)``.
"""

from __future__ import annotations

from typing import Any

from ..dtypes import DType
from ..errors import UnsupportedGradient
from ..kernels import user_fns
from ..runtime.raw import RawTensor
from .autodiff import Grads, rule
from .execute import emit
from .graph import Node
from .ops import OPS, Meta, OpDef


def _meta(ins: list[RawTensor], attrs: dict[str, Any]) -> Meta:
    return ins[0].shape, DType.f32


OPS["elemental"] = OpDef("elemental", infer=_meta)


@rule("elemental")
def _elemental(n: Node, g: Node) -> Grads:
    entry = user_fns.get(n.attrs["fn"])
    if not entry.grads:
        raise UnsupportedGradient(f"{entry.label} has no gradient rule (it is itself a "
                                  "gradient)")
    params = tuple(n.attrs.get("params", ()))
    ins = (*n.inputs, n, g)
    grads: list[Node | None] = []
    for x, key in zip(n.inputs, entry.grads):
        if not x.requires_grad:
            grads.append(None)
            continue
        grads.append(emit("elemental", ins, fn=key, params=params))
    return tuple(grads)


def elemental(inputs: tuple[Node, ...], key: str, params: tuple[Any, ...]) -> Node:
    """Emit ``elemental`` over aligned same-shaped operands."""
    return emit("elemental", inputs, fn=key, params=params)
