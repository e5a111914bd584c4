"""Name the argument behind a bad value, for error messages.

A facade method hands its arguments to shared validators (the tag algebra,
the operand check), which know the value but not the parameter it came in.
On the error path only, :func:`explain` walks the interpreter stack to the
outermost ``fucina`` frame (the call the user made) and looks for the
parameter bound to that very object, so a swapped argument reads as
``concat(): argument 'tag' expects a tag name (str), got a tensor ...``.
Nothing here runs unless an error is being raised.
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

_PACKAGE = __name__.split(".")[0]


def _fucina_frames() -> list[FrameType]:
    """Frames of this package from the innermost caller outward, up to user code."""
    frames: list[FrameType] = []
    f: FrameType | None = sys._getframe(2)
    while f is not None:
        name = f.f_globals.get("__name__", "")
        if name != _PACKAGE and not name.startswith(_PACKAGE + "."):
            if frames:
                break
        else:
            frames.append(f)
        f = f.f_back
    return frames


def _annotations(frame: FrameType) -> dict[str, Any]:
    """The annotations of the function running in ``frame`` (empty when not found)."""
    code = frame.f_code
    local = frame.f_locals
    owner = local.get("self", local.get("cls"))
    fn: Any = None
    if owner is not None:
        fn = getattr(owner if isinstance(owner, type) else type(owner), code.co_name, None)
    if fn is None:
        fn = frame.f_globals.get(code.co_name)
    fn = getattr(fn, "__func__", fn)
    if getattr(fn, "__code__", None) is not code:
        return {}
    return dict(getattr(fn, "__annotations__", {}))


def _parameter_of(frame: FrameType, value: object, kind: str) -> str | None:
    code = frame.f_code
    n = code.co_argcount + code.co_kwonlyargcount
    names = list(code.co_varnames[:n])
    flags = code.co_flags
    if flags & 0x04:  # *args
        names.append(code.co_varnames[n])
        n += 1
    if flags & 0x08:  # **kwargs
        names.append(code.co_varnames[n])
    local = frame.f_locals
    found: list[tuple[str, str]] = []
    for name in names:
        if name in ("self", "cls"):
            continue
        v = local.get(name)
        if v is value:
            found.append((name, repr(name)))
        elif isinstance(v, (tuple, list)) and any(x is value for x in v):
            found.append((name, f"{name!r} (an element)"))
        elif isinstance(v, dict) and any(x is value for x in v.values()):
            found.append((name, f"{name!r} (a keyword)"))
    if len(found) > 1 and kind:
        # One object passed twice (``x.dot(x, x)``): blame the parameter whose annotation
        # asks for the other kind of value.
        ann = _annotations(frame)
        fitting = [f for f in found if kind in str(ann.get(f[0], ""))]
        found = fitting or found
    return found[0][1] if found else None


def describe(value: object) -> str:
    """What ``value`` is, briefly: a tensor by its type, anything else by type and value."""
    cls = type(value)
    if getattr(cls, "axis_tags", None) is not None and hasattr(cls, "dtype"):
        return f"a tensor of type {cls!r}"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{cls.__name__} {text}"


def caller_name() -> str | None:
    """Name of the outermost package function on the stack (the call the user made)."""
    frames = _fucina_frames()
    return frames[-1].f_code.co_name if frames else None


def bad_argument(name: str, value: object, expected: str) -> str:
    """``"<fn>(): argument '<name>' expects <expected>, got <what value is>"``.

    For validators that know the parameter's name (sizes, counts, numbers): no
    search by identity, so two parameters holding one small int are never confused.
    """
    fn = caller_name()
    where = f"{fn}(): " if fn else ""
    return f"{where}argument {name!r} expects {expected}, got {describe(value)}"


def explain(value: object, expected: str) -> str:
    """``"<fn>(): argument '<name>' expects <expected>, got <what value is>"``.

    The argument is found by identity among the parameters of the package's
    frames on the stack, outermost first (the call the user wrote); when no
    parameter holds the value, the message names what was expected only.
    """
    got = describe(value)
    kind = "str" if "tag" in expected else "Tensor" if "tensor" in expected else ""
    for frame in reversed(_fucina_frames()):
        name = _parameter_of(frame, value, kind)
        if name is not None:
            return f"{frame.f_code.co_name}(): argument {name} expects {expected}, got {got}"
    return f"expected {expected}, got {got}"
