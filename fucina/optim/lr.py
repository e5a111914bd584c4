"""Learning-rate schedules.

:func:`warmup_cosine_factor` is the reference's pure factor of the step
(scale a base lr by it each step; resuming just re-applies it). The
schedulers follow ``torch.optim.lr_scheduler``: built on an optimizer, they
set ``group["lr"]`` at construction and on each :meth:`LRScheduler.step`,
called after ``optimizer.step()``, producing torch's lr sequence.
"""

from __future__ import annotations

import abc
import math
import numbers
from typing import Any

from ..tensor.arguments import real_value
from .optimizer import Optimizer

#: Largest step count or period the schedules take: exact in a float.
_MAX_INT = 2**53


def _real(v: Any, name: str) -> float:
    """A finite real number (not bool) as a float; ValueError naming ``name`` otherwise."""
    f = real_value(v)
    if f is None or not math.isfinite(f):
        raise ValueError(f"{name} must be a finite real number, got {v!r}")
    return f


def warmup_cosine_factor(step: int, total_steps: int, warmup_steps: int,
                         min_factor: float) -> float:
    """Linear warmup from ``1/warmup_steps`` to 1 over ``warmup_steps`` (``step`` is
    0-based), then cosine decay to ``min_factor`` at ``total_steps`` (and after)."""
    for name, v in (("step", step), ("total_steps", total_steps),
                    ("warmup_steps", warmup_steps)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) \
                or not 0 <= int(v) <= _MAX_INT:
            raise ValueError(f"warmup_cosine_factor: {name} must be an integer in [0, 2**53], "
                             f"got {v!r}")
    min_factor = _real(min_factor, "warmup_cosine_factor: min_factor")
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if total_steps <= warmup_steps:
        return float(min_factor)
    progress = min((step - warmup_steps) / (total_steps - warmup_steps), 1.0)
    return min_factor + (1.0 - min_factor) * 0.5 * (1.0 + math.cos(math.pi * progress))


class LRScheduler(abc.ABC):
    """Base of the torch-shaped schedulers: subclasses define :meth:`get_lr`.

    ``last_epoch`` counts ``step()`` calls (-1 before construction's own
    step); ``base_lrs`` are the groups' ``"initial_lr"`` (set from their lr
    on a fresh start).
    """

    optimizer: Optimizer
    base_lrs: list[float]
    last_epoch: int
    _step_count: int
    _initial: bool
    _last_lr: list[float]

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not a fucina.optim optimizer")
        if isinstance(last_epoch, bool) or not isinstance(last_epoch, numbers.Integral) \
                or last_epoch < -1:
            raise ValueError(f"last_epoch must be an integer >= -1, got {last_epoch!r}")
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            for i, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise KeyError(f"param_groups[{i}] has no 'initial_lr' to resume a "
                                   f"scheduler at last_epoch={last_epoch}; load the "
                                   "optimizer's state dict first")
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = int(last_epoch)
        self._step_count = 0
        self._initial = True
        try:
            self.step()
        finally:
            self._initial = False

    @abc.abstractmethod
    def get_lr(self) -> list[float]:
        """The groups' next learning rates (recursive form, from the current ones)."""

    def step(self) -> None:
        """Advance one epoch and write the new learning rates into the groups."""
        self._step_count += 1
        self.last_epoch += 1
        values = self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, values):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def get_last_lr(self) -> list[float]:
        """The learning rates the last ``step()`` (or construction) set."""
        return list(self._last_lr)

    def _lrs(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        """Everything but the optimizer."""
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s values."""
        self.__dict__.update(state_dict)


def _positive_int(v: Any, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) \
            or not 0 < int(v) <= _MAX_INT:
        raise ValueError(f"{name} must be a positive integer up to 2**53, got {v!r}")
    return int(v)


class StepLR(LRScheduler):
    """Multiply each group's lr by ``gamma`` every ``step_size`` epochs."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1,
                 last_epoch: int = -1):
        self.step_size = _positive_int(step_size, "step_size")
        self.gamma = _real(gamma, "gamma")
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        """torch's recursive StepLR rule."""
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return self._lrs()
        return [lr * self.gamma for lr in self._lrs()]


class CosineAnnealingLR(LRScheduler):
    """Cosine annealing from the base lr to ``eta_min`` over ``T_max`` epochs (and back,
    periodically, as in torch)."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0,
                 last_epoch: int = -1):
        self.T_max = _positive_int(T_max, "T_max")
        self.eta_min = _real(eta_min, "eta_min")
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        """torch's recursive CosineAnnealingLR rule."""
        t, T, lo = self.last_epoch, self.T_max, self.eta_min
        if self._initial:
            return self._lrs()
        if self._step_count == 1 and t > 0:
            return [lo + (base - lo) * (1 + math.cos(t * math.pi / T)) / 2
                    for base in self.base_lrs]
        if (t - 1 - T) % (2 * T) == 0:
            return [lr + (base - lo) * (1 - math.cos(math.pi / T)) / 2
                    for base, lr in zip(self.base_lrs, self._lrs())]
        return [(1 + math.cos(math.pi * t / T)) / (1 + math.cos(math.pi * (t - 1) / T))
                * (lr - lo) + lo for lr in self._lrs()]


class LinearLR(LRScheduler):
    """Scale the lr linearly from ``start_factor`` to ``end_factor`` over ``total_iters``
    epochs, then hold it."""

    def __init__(self, optimizer: Optimizer, start_factor: float = 1.0 / 3,
                 end_factor: float = 1.0, total_iters: int = 5, last_epoch: int = -1):
        if not 0 < _real(start_factor, "start_factor") <= 1:
            raise ValueError(f"start_factor must be in (0, 1], got {start_factor!r}")
        if not 0 <= _real(end_factor, "end_factor") <= 1:
            raise ValueError(f"end_factor must be in [0, 1], got {end_factor!r}")
        self.start_factor = float(start_factor)
        self.end_factor = float(end_factor)
        self.total_iters = _positive_int(total_iters, "total_iters")
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        """torch's recursive LinearLR rule."""
        t, a, b, n = self.last_epoch, self.start_factor, self.end_factor, self.total_iters
        if t == 0:
            return [lr * a for lr in self._lrs()]
        if self._initial or t > n:
            return self._lrs()
        return [lr * (1.0 + (b - a) / (n * a + (t - 1) * (b - a))) for lr in self._lrs()]
