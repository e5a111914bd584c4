"""Square float32 blocks transposed in vector registers, for packing GEMM panels.

The stacked GEMM (:mod:`fucina.kernels.batched_gemm`) packs a ``B`` whose rows
are not unit-stride into a ``[K, N]`` panel. For attention scores ``q . k`` over
the head axis, ``B`` is ``k`` read transposed: the panel is a transpose of
``k``'s rows. Element by element that copy cost about two cycles per element
(one scattered store each) and a third of the scores product's time at 128
tokens (48 matrices of 128 x 64 x 128, one thread: 2.5 ms packed against 1.7
with a pre-transposed ``B``; Intel Xeon, AVX-512).

:func:`tblock` moves a ``LANES x LANES`` block at a time: ``LANES`` vector loads,
a butterfly of two-source shuffles (log2(LANES) stages, each lane pair swapped
as a whole block), ``LANES`` vector stores. The shuffles are generic LLVM IR:
the backend lowers them for the target's vector width (one ``vpermt2ps`` each
with AVX-512), so the same code serves 8-lane (AVX2) and 16-lane tiles.
Values are copied, never computed: the panel holds the same bits either way.

The caller guarantees every index is inside its array: nothing is checked.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .microkernel import LANES

__all__ = ["LANES", "make_tblock", "tblock"]


def _stage(rows: list[ir.Value], b: int, builder: ir.IRBuilder, lanes: int) -> list[ir.Value]:
    """One butterfly stage: rows ``r`` and ``r + b`` swap their off-diagonal ``b``-blocks."""
    i32 = ir.IntType(32)
    lo = [j if (j // b) % 2 == 0 else lanes + j - b for j in range(lanes)]
    hi = [j + b if (j // b) % 2 == 0 else lanes + j for j in range(lanes)]
    out = list(rows)
    for r in range(lanes):
        if (r // b) % 2:
            continue
        x, y = rows[r], rows[r + b]
        out[r] = builder.shuffle_vector(x, y, ir.Constant(ir.VectorType(i32, lanes), lo))
        out[r + b] = builder.shuffle_vector(x, y, ir.Constant(ir.VectorType(i32, lanes), hi))
    return out


def make_tblock(lanes: int):  # type: ignore[no-untyped-def]
    """The block-transpose intrinsic for ``lanes x lanes`` blocks (a power of two);
    :func:`tblock` is the one at the tiles' width, :data:`LANES`."""
    if lanes < 1 or lanes & (lanes - 1):
        raise ValueError(f"lanes must be a power of two, got {lanes}")

    @intrinsic
    def tblock(typingctx, src, s_off, s_ld, dst, d_off, d_ld):
        """``dst[d_off + j * d_ld + i] = src[s_off + i * s_ld + j]`` for ``i, j < lanes``
        (element offsets from each array's first element; ``src`` may be read-only)."""
        for arr in (src, dst):
            if not isinstance(arr, types.Array) or arr.dtype != types.float32:
                return None
        if not dst.mutable:
            return None
        sig = types.void(src, types.int64, types.int64, dst, types.int64, types.int64)
        return sig, _codegen(lanes)

    return tblock


def _codegen(lanes: int):  # type: ignore[no-untyped-def]
    """LLVM for one block (the signature is the intrinsic's)."""

    def codegen(context, builder, signature, args):
        src_arr, s_off, s_ld, dst_arr, d_off, d_ld = args
        vptr = ir.VectorType(ir.FloatType(), lanes).as_pointer()
        i64 = ir.IntType(64)
        s_ptr = context.make_array(signature.args[0])(context, builder, src_arr).data
        d_ptr = context.make_array(signature.args[3])(context, builder, dst_arr).data
        rows = []
        for i in range(lanes):
            at = builder.add(s_off, builder.mul(ir.Constant(i64, i), s_ld))
            rows.append(builder.load(builder.bitcast(builder.gep(s_ptr, [at]), vptr), align=4))
        b = 1
        while b < lanes:
            rows = _stage(rows, b, builder, lanes)
            b *= 2
        for j in range(lanes):
            at = builder.add(d_off, builder.mul(ir.Constant(i64, j), d_ld))
            builder.store(rows[j], builder.bitcast(builder.gep(d_ptr, [at]), vptr), align=4)
        return context.get_dummy_value()

    return codegen


tblock = make_tblock(LANES)
"""``dst[d_off + j * d_ld + i] = src[s_off + i * s_ld + j]`` for ``i, j < LANES``."""
