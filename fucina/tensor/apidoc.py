"""The method reference of docs/API.md, generated from the facade's classes.

``python -m fucina.tensor.apidoc --write`` rewrites the generated section of
docs/API.md (between the BEGIN/END markers); ``--check`` exits non-zero when
it is stale. tests/test_docs.py runs the check, so the reference cannot drift
from the classes: a new method, a changed signature or docstring shows up as
a failing test until the section is regenerated.
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
from pathlib import Path
from typing import Any

from ..dtypes import DType
from . import branches
from .base import Tensor

BEGIN = "<!-- BEGIN GENERATED METHOD REFERENCE: python -m fucina.tensor.apidoc --write -->"
END = "<!-- END GENERATED METHOD REFERENCE -->"

#: op-family modules in reading order; mixins of modules not listed follow, by name.
_MODULE_ORDER = ("base", "construct", "views", "structural", "math", "unary", "masks",
                 "reductions", "scans", "softmax", "norms", "rope", "attention", "conv", "gated",
                 "activations", "elemental", "losses", "selection", "inplace", "contract",
                 "quantized", "autograd")


def branch_classes() -> list[type]:
    """The branch classes, in DType declaration order of their first dtype."""
    out: list[type] = []
    for dt in DType:
        b = branches.branch_for(dt)
        if b not in out:
            out.append(b)
    return out


def _branch_label(branch: type) -> str:
    dts = [dt for dt in DType if branches.branch_for(dt) is branch]
    if all(dt.is_block for dt in dts):
        return "block-quantized"
    return ", ".join(dt.value for dt in dts)


def _first_line(cls: type) -> int:
    """Where ``cls`` starts in its module (its first method's line): source order."""
    lines = [getattr(v, "__func__", v).__code__.co_firstlineno for v in vars(cls).values()
             if inspect.isfunction(getattr(v, "__func__", v))]
    lines += [v.fget.__code__.co_firstlineno for v in vars(cls).values()
              if isinstance(v, property) and inspect.isfunction(v.fget)]
    return min(lines, default=0)


def mixins() -> list[type]:
    """Every class that contributes methods to some branch, the root first."""
    found: list[type] = []
    for b in branch_classes():
        for k in b.__mro__:
            if k is not object and k not in found and k not in branch_classes():
                found.append(k)

    def key(k: type) -> tuple[int, str, int]:
        mod = k.__module__.rsplit(".", 1)[-1]
        rank = _MODULE_ORDER.index(mod) if mod in _MODULE_ORDER else len(_MODULE_ORDER)
        return rank, mod if rank == len(_MODULE_ORDER) else "", _first_line(k)

    return sorted(found, key=key)


def public_members(cls: type) -> list[tuple[str, Any]]:
    """(name, attribute) of the public methods and properties ``cls`` itself defines:
    plain names and the operator / protocol dunders, in source order."""
    out = []
    for name, attr in vars(cls).items():
        if name.startswith("_") and not (name.startswith("__") and name.endswith("__")):
            continue
        fn = attr.fget if isinstance(attr, property) else getattr(attr, "__func__", attr)
        if not inspect.isfunction(fn) or fn.__name__ in ("__new__", "__init_subclass__"):
            continue
        out.append((name, attr))
    return out


def _doc(fn: Any, where: str) -> str:
    doc = inspect.getdoc(fn)
    if not doc:
        raise ValueError(f"{where} has no docstring: every public method needs one")
    doc = re.sub(r":(?:meth|class|func|attr):`~?(?:[\w.]+\.)?(\w+)`", r"`\1`", doc)
    return doc.replace("``", "`")


def _annotation(a: Any) -> str:
    return a if isinstance(a, str) else getattr(a, "__name__", repr(a))


def _signature(name: str, attr: Any) -> str:
    if isinstance(attr, property):
        ret = attr.fget.__annotations__.get("return")
        return f"x.{name}" + (f" -> {_annotation(ret)}" if ret else "")
    fn = getattr(attr, "__func__", attr)
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())[1:]
    parts = []
    star = False
    for p in params:
        text = p.name
        if p.kind is p.VAR_POSITIONAL:
            text, star = "*" + p.name, True
        elif p.kind is p.VAR_KEYWORD:
            text = "**" + p.name
        elif p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        if p.annotation is not p.empty:
            text += f": {_annotation(p.annotation)}"
        if p.default is not p.empty:
            text += f" = {p.default!r}"
        parts.append(text)
    owner = "T" if isinstance(attr, classmethod) else "x"
    ret = sig.return_annotation
    tail = "" if ret is sig.empty else f" -> {_annotation(ret)}"
    return f"{owner}.{name}({', '.join(parts)}){tail}"


def render() -> str:
    """The generated section (markers included)."""
    all_branches = branch_classes()
    lines = [BEGIN, "", "## Method reference", "",
             "Generated from the classes (`python -m fucina.tensor.apidoc --write`). `x` is a "
             "tensor, `T` a tensor type (`T = fucina.Tensor(...)`); `Self` is a tensor of "
             "the same branch as `x` (the same dtype family; its tags may differ). Each "
             "group is one capability mixin, listed with the dtypes whose branch has it; a "
             "dtype whose branch lacks a group has none of its methods.", ""]
    for cls in mixins():
        members = public_members(cls)
        if not members:
            continue
        has = [b for b in all_branches if issubclass(b, cls)]
        where = ("every dtype" if len(has) == len(all_branches)
                 else "; ".join(_branch_label(b) for b in has))
        title = "Tensor (root)" if cls is Tensor else cls.__name__
        summary = _doc(cls, cls.__name__).split("\n\n")[0].replace("\n", " ")
        lines += [f"### {title}", "", f"{summary} *Dtypes: {where}.*", ""]
        for name, attr in members:
            fn = attr.fget if isinstance(attr, property) else getattr(attr, "__func__", attr)
            lines += [f"- `{_signature(name, attr)}`", ""]
            body = _doc(fn, f"{cls.__name__}.{name}")
            lines += ["  " + ln if ln else "" for ln in body.splitlines()]
            lines.append("")
    lines.append(END)
    return "\n".join(lines) + "\n"


def _api_md() -> Path:
    return Path(__file__).resolve().parents[2] / "docs" / "API.md"


def current(text: str) -> str:
    """The generated section of ``text`` (markers included); ValueError if absent."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < 0:
        raise ValueError("docs/API.md has no generated method reference markers")
    return text[start:end + len(END)] + "\n"


def main(argv: list[str] | None = None) -> int:
    """``--write`` regenerates docs/API.md's reference; ``--check`` reports staleness."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="rewrite docs/API.md in place")
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/API.md is stale")
    ap.add_argument("--path", type=Path, default=None, help="the API.md to use")
    args = ap.parse_args(argv)
    path = args.path or _api_md()
    fresh = render()
    if args.write:
        text = path.read_text()
        try:
            old = current(text)
            text = text.replace(old, fresh)
        except ValueError:
            text = text.rstrip("\n") + "\n\n" + fresh
        path.write_text(text)
        return 0
    if args.check:
        ok = current(path.read_text()) == fresh
        if not ok:
            print(f"{path} is stale: run python -m fucina.tensor.apidoc --write", file=sys.stderr)
        return 0 if ok else 1
    sys.stdout.write(fresh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
