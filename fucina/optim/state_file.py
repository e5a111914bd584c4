"""Training state on disk: named parameters plus optimizer state in one safetensors file.

``save_state(path, params, optimizer)`` writes each parameter under its name,
each optimizer state tensor as ``optimizer/<param name>/<entry>`` (step counts
as int64 scalars) and the param groups (options, parameters by name) as JSON
in the file's metadata. ``load_state(path, params, optimizer)`` checks every
name, shape and dtype (and the optimizer type and groups) before it changes
anything, then writes the values into the live parameters in place and loads
the optimizer state: training resumes exactly where it stopped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import safetensors as st
from .inplace import refuse_trace
from .optimizer import Optimizer, _is_tensor

_GROUPS = "optimizer/param_groups"
_TYPE = "optimizer/type"


def _names(params: Mapping[str, Any], what: str) -> dict[int, str]:
    if not isinstance(params, Mapping):
        raise TypeError(f"{what}: params must be a dict of name -> variable, got "
                        f"{type(params).__name__}")
    out: dict[int, str] = {}
    for name, p in params.items():
        if not isinstance(name, str) or not name or "/" in name:
            raise ValueError(f"{what}: parameter name {name!r} must be a non-empty string "
                             "without '/'")
        if not _is_tensor(p):
            raise TypeError(f"{what}: params[{name!r}] must be a fucina tensor, got "
                            f"{type(p).__name__}")
        if id(p._node) in out:
            raise ValueError(f"{what}: params[{name!r}] is the same tensor as "
                             f"params[{out[id(p._node)]!r}]")
        out[id(p._node)] = name
    return out


def _optimizer_names(optimizer: Optimizer, names: dict[int, str], what: str) -> list[str]:
    """The name of each of the optimizer's parameters, in its state-dict order."""
    out = []
    for k, p in enumerate(optimizer._params()):
        name = names.get(id(p._node))
        if name is None:
            raise ValueError(f"{what}: the optimizer's parameter {k} ({type(p)!r}, shape "
                             f"{p.shape}) is not among the named params")
        out.append(name)
    return out


def save_state(path: str | os.PathLike[str], params: Mapping[str, Any],
               optimizer: Optimizer | None = None,
               metadata: Mapping[str, str] | None = None) -> None:
    """Write ``params`` (name -> tensor) and ``optimizer``'s state to a safetensors file."""
    refuse_trace("save_state()")
    names = _names(params, "save_state")
    tensors: dict[str, Any] = dict(params)
    meta = {str(k): str(v) for k, v in (metadata or {}).items()}
    if optimizer is not None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"save_state: {type(optimizer).__name__} is not a fucina.optim "
                            "optimizer")
        order = _optimizer_names(optimizer, names, "save_state")
        sd = optimizer.state_dict()
        for index, entry in sd["state"].items():
            for key, value in entry.items():
                name = f"optimizer/{order[index]}/{key}"
                tensors[name] = (np.asarray(value, dtype=np.int64) if key == "step"
                                 else value)
        groups = []
        for g in sd["param_groups"]:
            packed = {k: v for k, v in g.items() if k != "params"}
            packed["params"] = [order[i] for i in g["params"]]
            groups.append(packed)
        meta[_GROUPS] = json.dumps(groups)
        meta[_TYPE] = type(optimizer).__name__
    st.save(path, tensors, meta)


def load_state(path: str | os.PathLike[str], params: Mapping[str, Any],
               optimizer: Optimizer | None = None) -> dict[str, str]:
    """Restore ``params`` in place (and ``optimizer``'s state) from :func:`save_state`'s file.

    Returns the file's metadata. A missing name, a wrong shape or dtype, a
    different optimizer type or param groups raise (ValueError/TypeError) and
    leave the parameters and the optimizer as they were.
    """
    refuse_trace("load_state()")
    names = _names(params, "load_state")
    with st.open(path) as f:
        values: dict[str, np.ndarray] = {}
        for name, p in params.items():
            info = f.tensors.get(name)
            if info is None:
                raise ValueError(f"load_state: {os.fspath(path)} has no parameter {name!r}")
            if info.dtype is not p.dtype:
                found = info.dtype.value if info.dtype is not None else info.st_dtype
                raise TypeError(f"load_state: {name!r} is {found} in the file, the parameter "
                                f"is {p.dtype.value}")
            if tuple(info.shape) != tuple(p.shape):
                raise ValueError(f"load_state: {name!r} has shape {info.shape} in the file, the "
                                 f"parameter has shape {tuple(p.shape)}")
            if p._node.value.storage.readonly:
                raise ValueError(f"load_state: params[{name!r}] has read-only storage")
            values[name] = np.array(f.array(name))
        meta = {k: v for k, v in f.metadata.items()}
        if optimizer is not None:
            sd = _optimizer_state(f, meta, optimizer, names)
    if optimizer is not None:
        optimizer.load_state_dict(sd)  # validates everything before changing anything
    for name, p in params.items():
        p._node.value.array()[...] = values[name]
    return {k: v for k, v in meta.items() if k not in (_GROUPS, _TYPE)}


def _optimizer_state(f: Any, meta: dict[str, str], optimizer: Optimizer,
                     names: dict[int, str]) -> dict[str, Any]:
    """The torch-shaped state dict the file holds for ``optimizer``'s parameters."""
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"load_state: {type(optimizer).__name__} is not a fucina.optim "
                        "optimizer")
    if _GROUPS not in meta:
        raise ValueError(f"load_state: {f.path} holds no optimizer state")
    if meta.get(_TYPE) != type(optimizer).__name__:
        raise TypeError(f"load_state: the file holds {meta.get(_TYPE)} state, the optimizer "
                        f"is {type(optimizer).__name__}")
    order = _optimizer_names(optimizer, names, "load_state")
    index = {name: k for k, name in enumerate(order)}
    groups = json.loads(meta[_GROUPS])
    if not isinstance(groups, list):
        raise ValueError(f"load_state: {f.path}: malformed optimizer param groups")
    for gi, g in enumerate(groups):
        if not isinstance(g, dict) or not isinstance(g.get("params"), list):
            raise ValueError(f"load_state: {f.path}: malformed optimizer param group {gi}")
        missing = [n for n in g["params"] if n not in index]
        if missing:
            raise ValueError(f"load_state: the file's param group {gi} names {missing[0]!r}, "
                             "which the optimizer does not hold")
        g["params"] = [index[n] for n in g["params"]]
        if "betas" in g:
            g["betas"] = tuple(g["betas"])
    state: dict[int, dict[str, Any]] = {}
    for key in f.tensors:
        if not key.startswith("optimizer/"):
            continue
        _, pname, entry = key.split("/", 2)
        if pname not in index:
            raise ValueError(f"load_state: the file has optimizer state for {pname!r}, which "
                             "the optimizer does not hold")
        # load_state_dict checks each value's shape and dtype (and the step count).
        state.setdefault(index[pname], {})[entry] = np.array(f.array(key))
    return {"state": state, "param_groups": groups}
