"""Numpy/Numba kernels behind the Fucina tensor operations."""

import os as _os

# Numba's parallel kernels run on its OpenMP pool. The default active wait
# spins idle threads, which on a small shared machine starves the thread that
# still has work (measured here: a 5-op chain ran 10x slower than serial under
# load). Passive waiting costs a few microseconds per launch instead. An
# explicit user setting wins.
_os.environ.setdefault("OMP_WAIT_POLICY", "passive")
