"""Fixtures shared by every test module."""

from __future__ import annotations

import pytest

import fucina


@pytest.fixture
def ctx() -> fucina.ExecContext:
    """A fresh execution context per test."""
    return fucina.ExecContext()
