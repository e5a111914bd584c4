"""A compile target narrower than the host's: the AVX2 path, run on an AVX-512 machine.

Numba compiles for the host's CPU and features unless ``NUMBA_CPU_FEATURES`` names
others; it reads that once, at import. A process started with the host's features
minus AVX-512 (:func:`narrowed_env`) builds every kernel with 256-bit vectors and
no mask registers: the code an AVX2 machine (Zen 3) runs, on this machine's cores.
That is how the test suite checks the AVX2 path on AVX-512 hosts, and how
``python -m fucina.bench --isa avx2`` measures it (torch and OpenBLAS are narrowed
alike there, so both sides run AVX2 code). Timing this way shows the vector path,
not another CPU: caches, clocks and ports stay the host's.

Only narrowing is possible: a host without AVX-512 cannot run code built for it.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["LEVELS", "host_features", "narrowed_env", "narrowed_features", "vector_bits"]

#: The targets a process can be narrowed to.
LEVELS = ("avx2",)
#: LLVM feature names above AVX2 + FMA (prefixes): off in a narrowed target.
_ABOVE_AVX2 = ("avx512", "amx", "avx10", "evex512")
#: Set in a narrowed process's environment (the level), so a relaunch happens once.
MARK = "FUCINA_ISA"


def host_features() -> dict[str, bool]:
    """The host CPU's features as LLVM names them (``{"avx2": True, ...}``)."""
    import llvmlite.binding as llvm

    return dict(llvm.get_host_cpu_features())


def narrowed_features(level: str, features: Mapping[str, bool] | None = None) -> str:
    """A ``NUMBA_CPU_FEATURES`` string: ``features`` (the host's by default) with
    everything above ``level`` turned off. ``ValueError`` for an unknown level or a
    CPU that lacks the level itself."""
    if level not in LEVELS:
        raise ValueError(f"unknown ISA level {level!r}; known: {', '.join(LEVELS)}")
    feats = dict(host_features() if features is None else features)
    missing = [k for k in ("avx2", "fma") if not feats.get(k)]
    if missing:
        raise ValueError(f"this CPU cannot run the {level} path: it lacks {', '.join(missing)}")
    return ",".join(("-" if k.startswith(_ABOVE_AVX2) else "+" if on else "-") + k
                    for k, on in sorted(feats.items()))


def narrowed_env(level: str, environ: Mapping[str, str],
                 features: Mapping[str, bool] | None = None) -> dict[str, str]:
    """``environ`` for a child process whose kernels, torch and OpenBLAS all run the
    ``level`` path: Numba's features (:func:`narrowed_features`), torch's ATen and
    oneDNN capability, MKL's instructions and OpenBLAS's kernel core."""
    env = dict(environ)
    env["NUMBA_CPU_FEATURES"] = narrowed_features(level, features)
    env["ATEN_CPU_CAPABILITY"] = "avx2"
    env["ONEDNN_MAX_CPU_ISA"] = "AVX2"
    env["MKL_ENABLE_INSTRUCTIONS"] = "AVX2"
    env["OPENBLAS_CORETYPE"] = "Haswell"  # OpenBLAS's AVX2 kernels
    env[MARK] = level
    return env


def vector_bits(features: str) -> int:
    """The widest float vectors a target with LLVM ``features`` (``"+avx2,-avx512f,..."``)
    gets from fucina's kernels: 512 with AVX-512F (:func:`fucina.kernels.vecmath.wide_vectors`
    asks for them), 256 with AVX, else 128."""
    on = set(features.split(","))
    if "+avx512f" in on:
        return 512
    return 256 if "+avx" in on else 128
