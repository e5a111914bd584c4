"""The optimizer base: parameter groups, per-parameter state and state dicts.

The structure is torch.optim's: ``param_groups`` is a list of dicts holding
``"params"`` and every option; ``state`` maps each parameter to its state
(tensors shaped like the parameter, and an integer ``"step"`` where the
update counts steps); ``state_dict()`` numbers the parameters in group
order. Updates are fucina tensor ops under ``no_grad`` plus in-place
``assign`` writes into the parameters' and state tensors' own storage.

Inside a function compiled by :func:`fucina.compile`, ``step()`` and
``zero_grad()`` become part of the program: the update reads the gradient
the traced backward produced, its per-step scalars (learning rate, bias
corrections) come from a small tensor per parameter that a host-side
prologue fills before every run (so step counts and schedules never
retrace), and the parameters and state are written in place. State tensors
are allocated once per parameter and updated in place ever after (a loaded
state dict is copied into them), so compiled programs keep reading the
right ones.
"""

from __future__ import annotations

import abc
import functools
import numbers
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ..dtypes import DType
from ..ir.execute import current_tracer
from ..runtime.gradmode import no_grad
from ..tensor import Tensor
from ..tensor.arguments import real_value
from .inplace import assign, refuse_trace

_MISSING = object()

#: A state entry: a tensor shaped like its parameter, or the integer step count.
StateValue = Any


def _is_tensor(x: Any) -> bool:
    return isinstance(x, Tensor) and type(x).axis_tags is not None


class Optimizer(abc.ABC):
    """Base class: subclasses define the options check, the state names, the per-step
    scalars and the tensor update."""

    #: Whether the state of a stepped parameter holds an integer ``"step"``.
    counts_steps = False
    #: Names of the per-step scalars :meth:`_scalars` computes, in hyper-tensor order.
    scalar_names: tuple[str, ...] = ()

    def __init__(self, params: Any, defaults: dict[str, Any]):
        if current_tracer() is not None:
            raise TypeError(f"{type(self).__name__}: build the optimizer outside the function "
                            "fucina.compile traces (its state must outlive one call)")
        self.defaults = dict(defaults)
        self.param_groups: list[dict[str, Any]] = []
        self.state: dict[Any, dict[str, StateValue]] = {}
        # Per parameter: its state tensors (allocated once, updated in place) and the
        # scalars tensor compiled steps read.
        self._slots: dict[Any, dict[str, Any]] = {}
        self._hyper: dict[Any, Any] = {}
        # Per parameter: (its scalars tensor's node, a writable numpy view of it), so a
        # compiled step's prologue writes the scalars without re-deriving the view.
        self._hyper_view: dict[Any, tuple[Any, np.ndarray]] = {}
        if _is_tensor(params) or isinstance(params, (Mapping, str, bytes)):
            raise TypeError("params must be an iterable of variables or of param groups "
                            f"(dicts), got {type(params).__name__}")
        try:
            groups = list(params)
        except TypeError:
            raise TypeError("params must be an iterable of variables or of param groups "
                            f"(dicts), got {type(params).__name__}") from None
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], Mapping):
            groups = [{"params": groups}]
        for k, g in enumerate(groups):
            if not isinstance(g, Mapping):
                raise TypeError(f"params[{k}]: mixing variables and param groups; every entry "
                                "must be a dict when the first one is")
            self.add_param_group(dict(g))

    # -- groups ------------------------------------------------------------------------

    def add_param_group(self, group: dict[str, Any]) -> None:
        """Add a group: a dict with ``"params"`` and any options (the rest take defaults)."""
        if not isinstance(group, Mapping):
            raise TypeError(f"a param group must be a dict, got {type(group).__name__}")
        if "params" not in group:
            raise ValueError("a param group needs a 'params' entry")
        gi = len(self.param_groups)
        raw = group["params"]
        if _is_tensor(raw):
            params = [raw]
        elif isinstance(raw, (set, frozenset)):
            raise TypeError(f"param_groups[{gi}]['params'] is a set; use a list (the order "
                            "numbers the state dict)")
        else:
            try:
                params = list(raw)
            except TypeError:
                raise TypeError(f"param_groups[{gi}]['params'] must be a list of variables, "
                                f"got {type(raw).__name__}") from None
        if not params:
            raise ValueError(f"param_groups[{gi}] has an empty 'params' list")
        seen = {id(p._node) for g in self.param_groups for p in g["params"]}
        for k, p in enumerate(params):
            where = f"param_groups[{gi}]['params'][{k}]"
            _check_param(p, where)
            if id(p._node) in seen:
                raise ValueError(f"{where} appears in the optimizer more than once")
            seen.add(id(p._node))
        full = dict(group)
        full["params"] = params
        for key, default in self.defaults.items():
            full.setdefault(key, default)
        self._check_group(full, gi)
        self.param_groups.append(full)

    @abc.abstractmethod
    def _check_group(self, group: dict[str, Any], gi: int) -> None:
        """Raise ValueError for options out of range."""

    @abc.abstractmethod
    def _state_names(self, group: dict[str, Any]) -> tuple[str, ...]:
        """Names of the tensor state entries a stepped parameter of ``group`` holds."""

    @abc.abstractmethod
    def _structure(self, group: dict[str, Any]) -> tuple[Any, ...]:
        """The option facts that change which ops an update runs (compiled steps retrace
        when they change; every other option is read at each step)."""

    @abc.abstractmethod
    def _scalars(self, group: dict[str, Any], state: dict[str, Any], first: bool
                 ) -> tuple[float, ...]:
        """The update's scalars for this step (in :attr:`scalar_names` order), computed on
        the host in float64 as torch computes them from Python floats."""

    @abc.abstractmethod
    def _update(self, group: dict[str, Any], p: Any, g: Any, slots: dict[str, Any],
                sc: dict[str, Any]) -> None:
        """One update of ``p`` with gradient ``g``: ``sc`` maps scalar names to floats
        (eager) or scalar tensors (compiled); ``slots`` are the state tensors."""

    def _params(self) -> list[Any]:
        return [p for g in self.param_groups for p in g["params"]]

    def __fucina_captures__(self) -> dict[str, Any]:
        """What a compiled function reads from this optimizer: its parameters and the
        option facts its update's ops depend on (hyperparameters are read per call)."""
        return {"params": self._params(),
                "structure": tuple(self._structure(g) for g in self.param_groups)}

    # -- stepping ------------------------------------------------------------------------

    def _slots_of(self, p: Any, group: dict[str, Any]) -> dict[str, Any]:
        slots = self._slots.get(p)
        if slots is None:
            slots = self._slots[p] = {}
        for name in self._state_names(group):
            if name not in slots:
                slots[name] = p.zeros_like()
        return slots

    def _begin(self, group: dict[str, Any], p: Any, slots: dict[str, Any]) -> tuple[Any, ...]:
        """Host bookkeeping of one parameter's step: state entry, step count, scalars."""
        state = self.state.get(p)
        first = not state
        if not state:
            for t in slots.values():  # a fresh start (also after loading "no state")
                t.data()[...] = 0.0
            state = self.state[p] = {}
            if self.counts_steps:
                state["step"] = 0
            for name in self._state_names(group):
                state[name] = slots[name]
        if self.counts_steps:
            state["step"] += 1
        return self._scalars(group, state, first)

    def step(self) -> None:
        """Update every parameter that has a gradient (torch skips the others too)."""
        tracer = current_tracer()
        if tracer is not None:
            self._traced_step(tracer)
            return
        with no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    g = p.grad_view()
                    if g is None:
                        continue
                    slots = self._slots_of(p, group)
                    values = self._begin(group, p, slots)
                    self._update(group, p, g, slots, dict(zip(self.scalar_names, values)))

    def _traced_step(self, tracer: Any) -> None:
        """``step()`` while fucina.compile traces: the update joins the program."""
        if not hasattr(tracer, "grad"):
            raise TypeError(f"{type(self).__name__}.step() cannot be traced here")
        updated: list[tuple[int, Any]] = []
        with no_grad():
            for gi, group in enumerate(self.param_groups):
                for p in group["params"]:
                    gnode = tracer.grad(p._node)
                    if gnode is None:
                        continue
                    g = type(p)._from_node(gnode, p._ctx)
                    slots = self._slots_of(p, group)
                    hyper = self._hyper.get(p)
                    if hyper is None:
                        n = len(self.scalar_names)
                        hyper = self._hyper[p] = Tensor("hyper").zeros(p._ctx, (n,))
                    sc = {name: hyper.select("hyper", j)
                          for j, name in enumerate(self.scalar_names)}
                    self._update(group, p, g, slots, sc)
                    updated.append((gi, p))
        tracer.prologue(functools.partial(self._prologue, updated))

    def _prologue(self, updated: list[tuple[int, Any]]) -> None:
        """Before each run of a compiled step: count the step, fill the scalars tensors."""
        groups = self.param_groups
        views = self._hyper_view
        for gi, p in updated:
            group = groups[gi]
            values = self._begin(group, p, self._slots_of(p, group))
            hyper = self._hyper[p]
            hit = views.get(p)
            if hit is None or hit[0] is not hyper._node_:
                hit = views[p] = (hyper._node_, hyper.data())
            hit[1][:] = values  # rounded to f32 as np.asarray(values, np.float32) rounds

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop every parameter's gradient (``set_to_none=False``: zero it in place)."""
        if current_tracer() is not None:
            for p in self._params():  # traced, both forms leave no contribution behind
                p.zero_grad()
            return
        for p in self._params():
            if set_to_none:
                p.zero_grad()
                continue
            g = p.grad_view()
            if g is not None:
                with no_grad():
                    assign(g, g * 0.0)

    # -- state dicts -------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """``{"state": {index: {name: value}}, "param_groups": [{option: value, "params":
        [index, ...]}]}`` with parameters numbered in group order; tensors are copies."""
        refuse_trace(f"{type(self).__name__}.state_dict()")
        groups, state, index = [], {}, 0
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            packed["params"] = list(range(index, index + len(group["params"])))
            groups.append(packed)
            for p in group["params"]:
                st = self.state.get(p)
                if st:
                    with no_grad():
                        state[index] = {k: (v if k == "step" else v.materialize())
                                        for k, v in st.items()}
                index += 1
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore options and state from :meth:`state_dict`'s structure.

        Everything is validated before anything changes: a missing group,
        option or state entry, a wrong shape or a wrong dtype raises
        ValueError/TypeError and leaves the optimizer and its parameters as
        they were. Tensors may be fucina tensors or arrays (numpy, torch).
        """
        refuse_trace(f"{type(self).__name__}.load_state_dict()")
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"state_dict must be a dict, got {type(state_dict).__name__}")
        for key in ("state", "param_groups"):
            if key not in state_dict:
                raise ValueError(f"state_dict is missing {key!r}")
        saved_groups = state_dict["param_groups"]
        if not isinstance(saved_groups, (list, tuple)):
            raise TypeError("state_dict['param_groups'] must be a list")
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"state_dict has {len(saved_groups)} param groups, the optimizer "
                             f"has {len(self.param_groups)}")
        new_groups: list[dict[str, Any]] = []
        owner: dict[int, tuple[Any, dict[str, Any]]] = {}
        for gi, (mine, saved) in enumerate(zip(self.param_groups, saved_groups)):
            if not isinstance(saved, Mapping):
                raise TypeError(f"state_dict['param_groups'][{gi}] must be a dict")
            if "params" not in saved:
                raise ValueError(f"state_dict['param_groups'][{gi}] is missing 'params'")
            ids = list(saved["params"])
            if len(ids) != len(mine["params"]):
                raise ValueError(f"state_dict['param_groups'][{gi}] has {len(ids)} params, the "
                                 f"optimizer's group has {len(mine['params'])}")
            for key in self.defaults:
                if key not in saved:
                    raise ValueError(f"state_dict['param_groups'][{gi}] is missing option "
                                     f"{key!r}")
            merged = {k: v for k, v in saved.items() if k != "params"}
            merged["params"] = mine["params"]
            self._check_group(merged, gi)
            new_groups.append(merged)
            for i, p in zip(ids, mine["params"]):
                owner[_index(i, f"state_dict['param_groups'][{gi}]['params']")] = (p, merged)
        saved_state = state_dict["state"]
        if not isinstance(saved_state, Mapping):
            raise TypeError("state_dict['state'] must be a dict")
        staged: dict[int, tuple[Any, dict[str, Any], dict[str, Any]]] = {}
        for key, entry in saved_state.items():
            i = _index(key, "state_dict['state']")
            if i not in owner:
                raise ValueError(f"state_dict['state'] has an entry for parameter {i}, which no "
                                 "param group lists")
            p, group = owner[i]
            staged[i] = (p, group, self._check_entry(i, entry, p, group))
        # Everything checked: copy the values into each parameter's state tensors (their
        # identity is kept, so compiled steps keep reading them).
        new_state: dict[Any, dict[str, Any]] = {}
        for _, (p, group, entry) in sorted(staged.items()):
            if not entry:
                continue
            slots = self._slots_of(p, group)
            st: dict[str, Any] = {}
            for name, value in entry.items():
                if name == "step":
                    st[name] = value
                else:
                    slots[name].data()[...] = value.reshape(-1)
                    st[name] = slots[name]
            new_state[p] = st
        self.param_groups = new_groups
        self.state = new_state

    def _check_entry(self, i: int, entry: Any, p: Any, group: dict[str, Any]) -> dict[str, Any]:
        """A saved state entry validated against parameter ``p``: name -> value."""
        where = f"state_dict['state'][{i}]"
        if not isinstance(entry, Mapping):
            raise TypeError(f"{where} must be a dict, got {type(entry).__name__}")
        if not entry:
            return {}
        names = self._state_names(group)
        want = set(names) | ({"step"} if self.counts_steps else set())
        for name in sorted(want):
            if name not in entry:
                raise ValueError(f"{where} is missing {name!r}")
        extra = sorted(set(entry) - want)
        if extra:
            raise ValueError(f"{where} has unexpected entries {extra} (expected "
                             f"{sorted(want)})")
        out: dict[str, Any] = {}
        if self.counts_steps:
            out["step"] = _step_count(entry["step"], f"{where}['step']")
        for name in names:
            out[name] = _state_array(entry[name], p, f"{where}[{name!r}]")
        return out


def _check_param(p: Any, where: str) -> None:
    if not _is_tensor(p):
        raise TypeError(f"{where} must be a fucina variable, got {type(p).__name__}")
    node = p._node  # raises Deinitialized
    if p.dtype is not DType.f32:
        raise TypeError(f"{where} is {type(p)!r}; fucina.optim updates f32 variables")
    if node.op != "variable":
        kind = "an op result that requires grad" if node.requires_grad else "a constant"
        raise ValueError(f"{where} is not a variable ({kind}); optimizers update trainable "
                         "leaves made with variable()/variable_from_slice()")
    if node.value.storage.readonly:
        raise ValueError(f"{where} has read-only storage and cannot be updated in place")


def _index(key: Any, where: str) -> int:
    if isinstance(key, bool) or not isinstance(key, (numbers.Integral, str)):
        raise TypeError(f"{where}: parameter index {key!r} is not an integer")
    try:
        return int(key)
    except ValueError:
        raise TypeError(f"{where}: parameter index {key!r} is not an integer") from None


def _step_count(v: Any, where: str) -> int:
    arr = np.asarray(v.numpy() if _is_tensor(v) else v)
    if arr.size != 1 or not (np.issubdtype(arr.dtype, np.integer)
                             or np.issubdtype(arr.dtype, np.floating)):
        raise TypeError(f"{where} must be one integer step count, got {v!r}")
    x = arr.reshape(-1)[0].item()
    if x != int(x) or x < 0:
        raise ValueError(f"{where} must be a non-negative integer, got {x!r}")
    return int(x)


def _state_array(v: Any, p: Any, where: str) -> np.ndarray:
    """A state tensor's values as an f32 array of ``p``'s shape (TypeError/ValueError)."""
    if _is_tensor(v):
        if v.dtype is not DType.f32:
            raise TypeError(f"{where} has dtype {v.dtype.value}, expected f32")
        arr = v.numpy()
    else:
        try:
            arr = np.asarray(v)
        except Exception:  # an object's __array__ may raise anything: report the entry
            raise TypeError(f"{where} must be a tensor or an array, got "
                            f"{type(v).__name__}") from None
        if arr.dtype != np.float32:
            raise TypeError(f"{where} has dtype {arr.dtype}, expected float32")
    if tuple(arr.shape) != tuple(p.shape):
        raise ValueError(f"{where} has shape {tuple(arr.shape)}, the parameter has shape "
                         f"{tuple(p.shape)}")
    return np.ascontiguousarray(arr)


def check_number(group: dict[str, Any], key: str, gi: int, *, low: float = 0.0,
                 high: float | None = None, high_open: bool = False,
                 value: Any = _MISSING) -> float:
    """``group[key]`` (or ``value``) as a float in [low, high] or [low, high); ValueError
    naming the group and option otherwise."""
    v = group[key] if value is _MISSING else value
    x = real_value(v)
    if x is None:
        raise ValueError(f"param_groups[{gi}]: {key} must be a number, got {v!r}")
    bad = not np.isfinite(x) or x < low or (high is not None and (x >= high if high_open
                                                                   else x > high))
    if bad:
        if high is None:
            rng = f">= {low}"
        else:
            rng = f"in [{low}, {high})" if high_open else f"in [{low}, {high}]"
        raise ValueError(f"param_groups[{gi}]: invalid {key} {v!r} (must be {rng})")
    return x


def iter_params(params: Iterable[Any] | Any) -> list[Any]:
    """A tensor or an iterable of tensors as a list (TypeError for anything else)."""
    if _is_tensor(params):
        return [params]
    if isinstance(params, (str, bytes, dict)):
        raise TypeError(f"params must be a tensor or an iterable of tensors, got "
                        f"{type(params).__name__}")
    try:
        return list(params)
    except TypeError:
        raise TypeError(f"params must be a tensor or an iterable of tensors, got "
                        f"{type(params).__name__}") from None
