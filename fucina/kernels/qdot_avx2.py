"""Integer block dots for x86 AVX2: quantized activations times quantized weights.

ggml's approach to bandwidth-bound GEMV: the activation row is quantized to
int8 per 32 elements (f32 scale), and each weight block's codes meet it in
``vpmaddubsw`` (unsigned 8-bit x signed 8-bit, pairwise-added to i16) and
``vpmaddwd`` (pairs to i32): 32 multiply-adds in a handful of instructions,
where decoding to f32 costs several per 8 elements. The weight codes are
unpacked to bytes inside the vector registers; nothing is stored.

These are Numba intrinsics emitting the AVX2 LLVM intrinsics, used only when
the host CPU reports AVX2 (:data:`AVX2`); other hosts run the f32 kernels of
:mod:`fucina.kernels.qmatmul`. Offsets are element indices into 1-D uint8 /
int8 arrays that the caller has bounds-checked (whole blocks of validated
arrays).
"""

from __future__ import annotations

import llvmlite.binding as _llvm
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

__all__ = ["AVX2", "dot_nibbles16", "dot_nibbles32", "dot_s8"]

AVX2: bool = bool(_llvm.get_host_cpu_features().get("avx2", False))

_I8 = ir.IntType(8)
_I16 = ir.IntType(16)
_I32 = ir.IntType(32)
_V32I8 = ir.VectorType(_I8, 32)
_V16I8 = ir.VectorType(_I8, 16)
_V16I16 = ir.VectorType(_I16, 16)
_V8I32 = ir.VectorType(_I32, 8)


def _load(builder: ir.IRBuilder, ctx: object, aty: object, arr: object, idx: object,
          vty: ir.VectorType) -> ir.Value:
    a = ctx.make_array(aty)(ctx, builder, arr)
    p = builder.gep(a.data, [idx])
    return builder.load(builder.bitcast(p, vty.as_pointer()), align=1)


def _maddubs_sum(builder: ir.IRBuilder, u8: ir.Value, s8: ir.Value) -> ir.Value:
    """sum_j u8[j] * s8[j] over 32 lanes as i32 (u8 unsigned, s8 signed)."""
    mod = builder.module
    f1 = mod.declare_intrinsic("llvm.x86.avx2.pmadd.ub.sw",
                               fnty=ir.FunctionType(_V16I16, [_V32I8, _V32I8]))
    f2 = mod.declare_intrinsic("llvm.x86.avx2.pmadd.wd",
                               fnty=ir.FunctionType(_V8I32, [_V16I16, _V16I16]))
    red = mod.declare_intrinsic("llvm.vector.reduce.add.v8i32",
                                fnty=ir.FunctionType(_I32, [_V8I32]))
    p16 = builder.call(f1, [u8, s8])
    ones = ir.Constant(_V16I16, [1] * 16)
    return builder.call(red, [builder.call(f2, [p16, ones])])


@intrinsic
def dot_s8(typingctx, w, wo, x, xo):
    """sum_{j<32} int8(w[wo+j]) * x[xo+j] (w: uint8 bytes holding int8 codes, x: int8)."""
    sig = types.int32(w, wo, x, xo)

    def codegen(ctx, builder, signature, args):
        wv = _load(builder, ctx, signature.args[0], args[0], args[1], _V32I8)
        xv = _load(builder, ctx, signature.args[2], args[2], args[3], _V32I8)
        sign = builder.module.declare_intrinsic(
            "llvm.x86.avx2.psign.b", fnty=ir.FunctionType(_V32I8, [_V32I8, _V32I8]))
        aw = builder.call(sign, [wv, wv])  # |w| (as unsigned: |-128| = 128 reads right)
        sx = builder.call(sign, [xv, wv])  # x with w's sign (0 where w is 0)
        return _maddubs_sum(builder, aw, sx)

    return sig, codegen


@intrinsic
def dot_nibbles16(typingctx, w, wo, x, xo):
    """16 bytes at w[wo:] hold 32 nibbles (low: element j, high: element j+16):
    sum_j nibble_j * x[xo+j] over the 32 elements."""
    sig = types.int32(w, wo, x, xo)

    def codegen(ctx, builder, signature, args):
        b = _load(builder, ctx, signature.args[0], args[0], args[1], _V16I8)
        lo = builder.and_(b, ir.Constant(_V16I8, [15] * 16))
        hi = builder.lshr(b, ir.Constant(_V16I8, [4] * 16))
        q = builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(_I32, 32), list(range(32))))
        xv = _load(builder, ctx, signature.args[2], args[2], args[3], _V32I8)
        return _maddubs_sum(builder, q, xv)

    return sig, codegen


@intrinsic
def dot_nibbles32(typingctx, w, wo, x, xo, high):
    """32 bytes at w[wo:]: their low (``high`` == 0) or high nibbles times x[xo:xo+32]."""
    sig = types.int32(w, wo, x, xo, high)

    def codegen(ctx, builder, signature, args):
        b = _load(builder, ctx, signature.args[0], args[0], args[1], _V32I8)
        sh = builder.trunc(builder.mul(args[4], ir.Constant(args[4].type, 4)), _I8)
        shv = builder.insert_element(ir.Constant(_V32I8, ir.Undefined), sh, ir.Constant(_I32, 0))
        shv = builder.shuffle_vector(shv, ir.Constant(_V32I8, ir.Undefined),
                                     ir.Constant(ir.VectorType(_I32, 32), [0] * 32))
        q = builder.and_(builder.lshr(b, shv), ir.Constant(_V32I8, [15] * 32))
        xv = _load(builder, ctx, signature.args[2], args[2], args[3], _V32I8)
        return _maddubs_sum(builder, q, xv)

    return sig, codegen
