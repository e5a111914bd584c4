"""GEMMs written straight into the layout a copy of their permuted result wants.

``p.dot(v, "key").permute_to("batch", "seq", "head", "hd").contiguous()`` (the
attention output before the output projection) records a ``contract`` into
``[batch, head, seq, hd]``, a permuting ``view`` and a ``copy``: a full pass
over the result only to reorder it. Here the ``copy`` node becomes the
``contract`` itself, its output labels permuted, so the GEMM writes each
element where the copy would have put it.

Compiled still equals eager bit for bit: the rewrite only applies when the
permutation keeps the GEMM's last output axis last (its unit-stride ``N``
axis), so the GEMM runs the same products with the same operands, orientation
and reduction order and only the output's row and batch strides change; the
copy it removes is exact. The ``copy`` node is rewritten in place (its users and
value stay), and only where no gradient flows: a backward pass built later from
the same traced nodes (a compiled function's VJP) sees the ops eager recorded.
"""

from __future__ import annotations

from collections import Counter

from .graph import Node, topo_order


def _permutation(view: Node) -> tuple[int, ...] | None:
    """``perm`` with ``view[i]`` reading axis ``perm[i]`` of its input, when ``view``
    is a pure axis permutation of its input (else None)."""
    a = view.attrs
    src = view.inputs[0].shape
    if any(a["base"]) or len(a["shape"]) != len(src):
        return None
    perm = []
    for row, n in zip(a["coeffs"], a["shape"]):
        ones = [j for j, c in enumerate(row) if c == 1]
        if len(ones) != 1 or any(c not in (0, 1) for c in row) or src[ones[0]] != n:
            return None
        perm.append(ones[0])
    return tuple(perm) if sorted(perm) == list(range(len(src))) else None


def gemm_into_copies(order: list[Node], roots: list[Node]) -> list[Node]:
    """Rewrite ``copy(permuting view(contract))`` chains in place (see the module
    docstring); returns the program's node order, recomputed when anything changed."""
    users: Counter[int] = Counter()
    for n in order:
        for v in n.inputs:
            users[id(v)] += 1
    for r in roots:
        users[id(r)] += 1
    changed = False
    for n in order:
        if n.op != "copy" or n.inputs[0].op != "view":
            continue
        view = n.inputs[0]
        gemm = view.inputs[0]
        if gemm.op != "contract" or users[id(gemm)] != 1 or users[id(view)] != 1:
            continue
        if n.requires_grad or gemm.requires_grad:
            continue  # a later backward pass (a compiled VJP) walks these nodes' rules
        if not (gemm.value.is_contiguous() and n.value.is_contiguous()
                and n.dtype is gemm.dtype):
            continue
        perm = _permutation(view)
        if perm is None or perm[-1] != len(perm) - 1:
            continue
        la, lb, lo = gemm.attrs["labels"]
        n.op = "contract"
        n.inputs = gemm.inputs
        n.attrs = dict(gemm.attrs, labels=(la, lb, tuple(lo[p] for p in perm)),
                       shape=tuple(n.shape))
        changed = True
    return topo_order(roots) if changed else order
