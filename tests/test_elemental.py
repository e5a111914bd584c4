"""elemental_unary / elemental_binary: user scalar functions compiled into kernels (no
torch needed). Values are checked against numpy and hand-derived gradients."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import fucina as F


class Square:
    @staticmethod
    def forward(x, extra):
        return x * x

    # Returns the propagated dL/dx, not the local dy/dx.
    @staticmethod
    def backward(x, y, grad_y, extra):
        return 2 * x * grad_y


class Affine:
    """extra = (scale, shift): scale * x + shift."""

    @staticmethod
    def forward(x, extra):
        return extra[0] * x + extra[1]

    @staticmethod
    def backward(x, y, grad_y, extra):
        return extra[0] * grad_y


class Power:
    """x ** extra (a number)."""

    @staticmethod
    def forward(x, extra):
        return x ** extra

    @staticmethod
    def backward(x, y, grad_y, extra):
        return grad_y * extra * x ** (extra - 1)


class Blend:
    """a * exp(-b) + extra[0] * b: a binary op with a tuple extra."""

    @staticmethod
    def forward(a, b, extra):
        return a * math.exp(-b) + extra[0] * b

    @staticmethod
    def backward(a, b, y, grad_y, extra):
        e = math.exp(-b)
        return grad_y * e, grad_y * (extra[0] - a * e)


def test_reference_snippet_elemental_unary(ctx):
    x = F.Tensor("d").variable_from_slice(ctx, (3,), [1, -2, 3])
    y = x.elemental_unary(Square, None)
    np.testing.assert_array_equal(y.data_const(), [1, 4, 9])
    y.sum_all().backward()
    np.testing.assert_array_equal(x.grad().data_const(), [2, -4, 6])


def test_extra_forms(ctx):
    x0 = np.array([0.5, 1.5, 2.0, 3.0], np.float32)
    x = F.Tensor("d").from_slice(ctx, (4,), x0)
    np.testing.assert_allclose(x.elemental_unary(Affine, (2.0, -1.0)).numpy(), 2 * x0 - 1,
                               rtol=1e-6)
    np.testing.assert_allclose(x.elemental_unary(Power, 3).numpy(), x0 ** 3, rtol=1e-6)
    np.testing.assert_allclose(x.elemental_unary(Power, 0.5).numpy(), np.sqrt(x0), rtol=1e-6)


def test_a_new_extra_value_compiles_nothing(ctx):
    x = F.Tensor("d").from_slice(ctx, (4,), [1, 2, 3, 4])
    x.elemental_unary(Affine, (2.0, 1.0))
    before = F.cache_info()
    y = x.elemental_unary(Affine, (-3.0, 0.25))
    after = F.cache_info()
    assert (after.compiled, after.kernels) == (before.compiled, before.kernels)
    np.testing.assert_allclose(y.numpy(), [-2.75, -5.75, -8.75, -11.75])


def test_binary_broadcasts_and_reduces_gradients(ctx):
    rng = np.random.default_rng(0)
    a0 = rng.standard_normal((3, 4)).astype(np.float32)
    b0 = rng.standard_normal(4).astype(np.float32)
    g0 = rng.standard_normal((4, 3)).astype(np.float32)
    a = F.Tensor("r", "c").variable_from_slice(ctx, a0.shape, a0)
    b = F.Tensor("c").variable_from_slice(ctx, b0.shape, b0)
    z = b.elemental_binary(a, Blend, (0.5,))  # self is b: result tags (c, r)
    assert type(z) is F.Tensor("c", "r")
    want = b0[:, None] * np.exp(-a0.T) + 0.5 * a0.T
    np.testing.assert_allclose(z.numpy(), want, rtol=1e-5, atol=1e-6)
    z.backward_with_grad(F.Tensor("c", "r").from_slice(ctx, g0.shape, g0))
    e = np.exp(-a0.T)
    np.testing.assert_allclose(b.grad().numpy(), (g0 * e).sum(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(a.grad().numpy(), (g0 * (0.5 - b0[:, None] * e)).T,
                               rtol=1e-5, atol=1e-6)


def test_only_operands_that_need_a_gradient_get_one(ctx):
    a = F.Tensor("d").variable_from_slice(ctx, (2,), [1.0, 2.0])
    b = F.Tensor("d").from_slice(ctx, (2,), [0.0, 1.0])
    a.elemental_binary(b, Blend, (1.0,)).sum_all().backward()
    np.testing.assert_allclose(a.grad().numpy(), np.exp([-0.0, -1.0]), rtol=1e-6)
    assert b.grad() is None


def test_compiled_fuses_with_neighbours_and_equals_eager(ctx):
    x = F.Tensor("r", "c").randn(ctx, (8, 16), 1)
    b = F.Tensor("c").randn(ctx, (16,), 2)

    def f(x, b):
        return x.elemental_binary(b, Blend, (0.25,)).elemental_unary(Square).tanh()

    fast = F.compile(f)
    np.testing.assert_allclose(fast(x, b).numpy(), f(x, b).numpy(), rtol=1e-6, atol=1e-7)
    assert len(fast.kernels(x, b)) == 1


def test_compiled_backward_equals_eager(ctx):
    x0 = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)

    def step(x):
        y = x.elemental_unary(Affine, (1.5, 0.5)).elemental_unary(Square)
        y.sum_all().backward()
        return y

    xe = F.Tensor("r", "c").variable_from_slice(ctx, x0.shape, x0)
    ye = step(xe)
    xc = F.Tensor("r", "c").variable_from_slice(ctx, x0.shape, x0)
    yc = F.compile(step)(xc)
    np.testing.assert_allclose(yc.numpy(), ye.numpy(), rtol=1e-6)
    np.testing.assert_allclose(xc.grad().numpy(), xe.grad().numpy(), rtol=1e-6)
    np.testing.assert_allclose(xe.grad().numpy(), 2 * (1.5 * x0 + 0.5) * 1.5, rtol=1e-5)


def test_two_ops_with_the_same_code_do_not_share_a_kernel(ctx):
    class First:
        @staticmethod
        def forward(x, extra):
            return x + 1

        @staticmethod
        def backward(x, y, grad_y, extra):
            return grad_y

    class Second(First):
        pass

    x = F.Tensor("d").randn(ctx, (5,), 0)
    k1 = F.compile(lambda x: x.elemental_unary(First)).kernels(x)[0]
    k2 = F.compile(lambda x: x.elemental_unary(Second)).kernels(x)[0]
    assert k1 is not k2 and k1.user_fns != k2.user_fns


def test_an_op_reading_an_opaque_object_runs_without_disk_cache(ctx):
    box = {"scale": 3.0}  # a dict has no stable fingerprint
    scale = box["scale"]

    class Scaled:
        @staticmethod
        def forward(x, extra):
            return x * scale

        @staticmethod
        def backward(x, y, grad_y, extra):
            return grad_y * scale

    class Opaque:
        @staticmethod
        def forward(x, extra):
            return x * len(box)

        @staticmethod
        def backward(x, y, grad_y, extra):
            return grad_y

    x = F.Tensor("d").from_slice(ctx, (2,), [1.0, 2.0])
    np.testing.assert_array_equal(x.elemental_unary(Scaled).numpy(), [3, 6])
    fast = F.compile(lambda x: x.elemental_unary(Scaled))
    assert "cache=True" in fast.kernels(x)[0].source
    with pytest.raises(TypeError, match="Opaque.forward"):  # Numba cannot type a dict
        x.elemental_unary(Opaque)
    fast = F.compile(lambda x: x.elemental_unary(Opaque))
    with pytest.raises(TypeError, match="Opaque.forward"):
        fast(x)
    assert "cache=False" in fast.kernels(x)[0].source


def test_numba_incompatible_code_is_a_type_error_naming_the_op(ctx):
    class Stringy:
        @staticmethod
        def forward(x, extra):
            return str(x)

        @staticmethod
        def backward(x, y, grad_y, extra):
            return grad_y

    x = F.Tensor("d").from_slice(ctx, (2,), [1.0, 2.0])
    with pytest.raises(TypeError, match="Stringy.forward"):
        x.elemental_unary(Stringy)
    with pytest.raises(TypeError, match="Stringy.forward"):
        F.compile(lambda x: x.elemental_unary(Stringy))(x)


def test_malformed_ops_and_extras(ctx):
    class NoBackward:
        @staticmethod
        def forward(x, extra):
            return x

    class Method:  # forgot @staticmethod: 3 parameters counting self
        def forward(self, x, extra):
            return x

        def backward(self, x, y, grad_y, extra):
            return grad_y

    x = F.Tensor("d").from_slice(ctx, (2,), [1.0, 2.0])
    with pytest.raises(TypeError, match="NoBackward.backward is missing"):
        x.elemental_unary(NoBackward)
    with pytest.raises(TypeError, match="staticmethod"):
        x.elemental_unary(Method)
    with pytest.raises(TypeError, match="staticmethod"):  # a unary op used as binary
        x.elemental_binary(x, Square)
    for bad in ("2", [1.0], True, (1.0, "x"), 2**70):
        with pytest.raises(TypeError, match="extra"):
            x.elemental_unary(Affine, bad)
    with pytest.raises(F.TagError):
        x.elemental_binary(F.Tensor("d", dtype="f64").zeros(ctx, (2,)), Blend, (1.0,))
    with pytest.raises(F.ShapeMismatch):
        x.elemental_binary(F.Tensor("d").zeros(ctx, (3,)), Blend, (1.0,))
    assert not hasattr(F.Tensor("d", dtype="f16"), "elemental_unary")
    assert not hasattr(F.Tensor("d", dtype="i32"), "elemental_binary")


_SCRIPT = textwrap.dedent("""
    import numpy as np
    import fucina as F
    from userop import Scaled
    ctx = F.ExecContext()
    x = F.Tensor("d").from_slice(ctx, (3,), [1.0, 2.0, 3.0])
    print(x.elemental_unary(Scaled).numpy().tolist(), F.cache_info().compiled)
""")


def test_disk_cache_is_reused_and_never_stale(tmp_path):
    """A second process loads the kernel from disk; changing a global the op reads gives
    a new kernel, not the stale cached one."""
    (tmp_path / "userop.py").write_text(textwrap.dedent("""
        SCALE = 2.0

        class Scaled:
            @staticmethod
            def forward(x, extra):
                return x * SCALE

            @staticmethod
            def backward(x, y, grad_y, extra):
                return grad_y * SCALE
    """))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, FUCINA_CACHE_DIR=str(tmp_path / "kernels"),
               PYTHONPATH=os.pathsep.join([str(tmp_path), root]))

    def run() -> str:
        out = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, cwd=tmp_path,
                             capture_output=True, text=True, check=True)
        return out.stdout.strip()

    assert run() == "[2.0, 4.0, 6.0] 1"
    assert run() == "[2.0, 4.0, 6.0] 0"  # loaded from the disk cache
    src = (tmp_path / "userop.py").read_text().replace("SCALE = 2.0", "SCALE = 5.0")
    (tmp_path / "userop.py").write_text(src)
    assert run() == "[5.0, 10.0, 15.0] 1"
