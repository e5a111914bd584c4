"""Block-sized rows in a kernel's own stack frame.

A generated kernel that runs a block of elements through several loops keeps
the block's intermediate values in rows like these: an ``alloca`` in the
function's entry block, so a row costs no allocation per call or per block (the
strip-mined kernels' ``np.empty`` per block had set their block at 4096
elements to amortize it; on the stack, 256 measured faster), and LLVM knows it
shares memory with no argument, so loops over it need no runtime alias checks.
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["ROW_ALIGN", "emit_row", "row"]

#: Byte alignment of every stack row: one cache line, one AVX-512 vector.
ROW_ALIGN = 64


@intrinsic
def row(typingctx: Any, proto: Any, size: Any) -> Any:
    """``row(proto, size)``: a 1-D array of ``size`` (a literal int) elements of the
    type of ``proto`` (a number or bool) on the calling function's stack.

    Uninitialized; valid until the function returns (a row made inside a loop is
    still one alloca, reused by every iteration).
    """
    if not isinstance(size, types.IntegerLiteral) or not isinstance(
            proto, (types.Float, types.Integer, types.Boolean)):
        return None
    n = int(size.literal_value)
    if n < 1:
        return None
    arrty = types.Array(proto, 1, "C")
    sig = arrty(proto, size)

    def codegen(context: Any, builder: ir.IRBuilder, signature: Any, args: Any) -> Any:
        return emit_row(context, builder, arrty, n, "stack_row")

    return sig, codegen


def emit_row(context: Any, builder: ir.IRBuilder, arrty: Any, n: int, name: str) -> Any:
    """LLVM for a 1-D array value of ``arrty`` over ``n`` elements alloca'd in the current
    function's entry block (for intrinsics: :func:`row`, ``lanes.scratch``)."""
    dty = context.get_data_type(arrty.dtype)  # bool is a byte in arrays
    buf = cgutils.alloca_once(builder, dty, size=n, name=name)
    # On a cache line: a vector store and the load reading it back share one line, so
    # the store buffer forwards the value (Zen 4 measured: a row of 64 float32 through
    # a scratch row at LLVM's default 4-byte alignment took 17.7 ns; on a line, 4.7).
    buf.align = ROW_ALIGN
    ary = context.make_array(arrty)(context, builder)
    itemsize = context.get_abi_sizeof(dty)
    intp = context.get_value_type(types.intp)
    context.populate_array(ary, data=buf, shape=[ir.Constant(intp, n)],
                           strides=[ir.Constant(intp, itemsize)],
                           itemsize=ir.Constant(intp, itemsize), meminfo=None)
    return ary._getvalue()
