"""Adam and AdamW: ``torch.optim.Adam``/``AdamW``'s single-tensor update rules."""

from __future__ import annotations

from typing import Any

from .inplace import assign
from .optimizer import Optimizer, check_number


class Adam(Optimizer):
    """torch.optim.Adam (coupled L2 weight decay: ``g += weight_decay * p``).

    With step count ``t``: ``m = lerp(m, g, 1 - beta1)``,
    ``v = beta2 * v + (1 - beta2) * g * g``,
    ``p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)``.
    The bias corrections and step size are computed in f64 on the host, as
    torch computes them from Python floats.
    """

    counts_steps = True
    decoupled = False

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps,
                                  "weight_decay": weight_decay})

    def _check_group(self, group: dict[str, Any], gi: int) -> None:
        check_number(group, "lr", gi)
        check_number(group, "eps", gi)
        check_number(group, "weight_decay", gi)
        betas = group["betas"]
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"param_groups[{gi}]: betas must be a pair, got {betas!r}")
        group["betas"] = tuple(betas)
        for k in range(2):
            check_number(group, f"betas[{k}]", gi, high=1.0, high_open=True, value=betas[k])

    scalar_names = ("decay", "wd", "one_minus_beta1", "beta2", "one_minus_beta2",
                    "step_size", "bias_correction2_sqrt", "eps")

    def _state_names(self, group: dict[str, Any]) -> tuple[str, ...]:
        return ("exp_avg", "exp_avg_sq")

    def _structure(self, group: dict[str, Any]) -> tuple[Any, ...]:
        return (group["weight_decay"] != 0,)

    def _scalars(self, group: dict[str, Any], state: dict[str, Any], first: bool
                 ) -> tuple[float, ...]:
        lr, wd = float(group["lr"]), float(group["weight_decay"])
        beta1, beta2 = (float(b) for b in group["betas"])
        step = state["step"]
        return (1.0 - lr * wd, wd, 1.0 - beta1, beta2, 1.0 - beta2,
                lr / (1.0 - beta1 ** step), (1.0 - beta2 ** step) ** 0.5, float(group["eps"]))

    def _update(self, group: dict[str, Any], p: Any, g: Any, slots: dict[str, Any],
                sc: dict[str, Any]) -> None:
        m, v = slots["exp_avg"], slots["exp_avg_sq"]
        if group["weight_decay"] != 0:
            if self.decoupled:
                assign(p, p * sc["decay"])
            else:
                g = g + p * sc["wd"]
        m_new = m + (g - m) * sc["one_minus_beta1"]
        assign(m, m_new)
        v_new = v * sc["beta2"] + g * sc["one_minus_beta2"] * g
        assign(v, v_new)
        denom = v_new.sqrt() / sc["bias_correction2_sqrt"] + sc["eps"]
        assign(p, p - (m_new / denom) * sc["step_size"])


class AdamW(Adam):
    """torch.optim.AdamW: decoupled weight decay (``p *= 1 - lr * weight_decay`` before the
    Adam step), default weight_decay 1e-2."""

    decoupled = True

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
