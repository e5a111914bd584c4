"""Stochastic gradient descent with momentum: ``torch.optim.SGD``'s update rule."""

from __future__ import annotations

from typing import Any

from .inplace import assign
from .optimizer import Optimizer, check_number


class SGD(Optimizer):
    """torch.optim.SGD: coupled weight decay, optional (Nesterov) momentum.

    Per parameter with gradient ``g``: ``d = g + weight_decay * p``; with
    momentum the buffer starts as a copy of ``d`` and then follows
    ``buf = momentum * buf + (1 - dampening) * d``, and ``d`` becomes ``buf``
    (or ``d + momentum * buf`` with Nesterov); finally ``p -= lr * d``.
    """

    def __init__(self, params: Any, lr: float = 1e-3, momentum: float = 0.0,
                 dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False):
        super().__init__(params, {"lr": lr, "momentum": momentum, "dampening": dampening,
                                  "weight_decay": weight_decay, "nesterov": nesterov})

    def _check_group(self, group: dict[str, Any], gi: int) -> None:
        check_number(group, "lr", gi)
        momentum = check_number(group, "momentum", gi)
        dampening = check_number(group, "dampening", gi, low=-float("inf"))
        check_number(group, "weight_decay", gi)
        if not isinstance(group["nesterov"], bool):
            raise ValueError(f"param_groups[{gi}]: nesterov must be a bool, got "
                             f"{group['nesterov']!r}")
        if group["nesterov"] and (momentum <= 0 or dampening != 0):
            raise ValueError(f"param_groups[{gi}]: Nesterov momentum requires a momentum > 0 "
                             "and zero dampening")

    scalar_names = ("lr", "wd", "keep", "take", "momentum")

    def _state_names(self, group: dict[str, Any]) -> tuple[str, ...]:
        return ("momentum_buffer",) if group["momentum"] != 0 else ()

    def _structure(self, group: dict[str, Any]) -> tuple[Any, ...]:
        return (group["momentum"] != 0, group["nesterov"], group["weight_decay"] != 0)

    def _scalars(self, group: dict[str, Any], state: dict[str, Any], first: bool
                 ) -> tuple[float, ...]:
        momentum = float(group["momentum"])
        # The first step starts the buffer as a copy of d: buf = 0 * buf + 1 * d.
        keep, take = (0.0, 1.0) if first else (momentum, 1.0 - group["dampening"])
        return (float(group["lr"]), float(group["weight_decay"]), keep, take, momentum)

    def _update(self, group: dict[str, Any], p: Any, g: Any, slots: dict[str, Any],
                sc: dict[str, Any]) -> None:
        d = g
        if group["weight_decay"] != 0:
            d = d + p * sc["wd"]
        if group["momentum"] != 0:
            buf = slots["momentum_buffer"]
            buf_new = buf * sc["keep"] + d * sc["take"]
            assign(buf, buf_new)
            d = d + buf_new * sc["momentum"] if group["nesterov"] else buf_new
        assign(p, p - d * sc["lr"])
