"""Shared fixtures for the pytest-benchmark files (run: python -m pytest benchmarks)."""

from __future__ import annotations

import pytest

import fucina as F


@pytest.fixture
def ctx() -> F.ExecContext:
    return F.ExecContext()
