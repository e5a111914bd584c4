"""Fixtures shared by every test module.

``FUCINA_TESTS_WITHOUT_TORCH=1`` makes ``import torch`` fail for the whole run, as
on a machine without it: torch-oracle modules skip, every other test must run.
"""

from __future__ import annotations

import importlib.abc
import os
import sys

import pytest

import fucina


class _BlockTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"{name} is blocked by FUCINA_TESTS_WITHOUT_TORCH")
        return None


if os.environ.get("FUCINA_TESTS_WITHOUT_TORCH"):
    if "torch" in sys.modules:
        raise RuntimeError("torch was imported before tests/conftest.py could block it")
    sys.meta_path.insert(0, _BlockTorch())


@pytest.fixture
def ctx() -> fucina.ExecContext:
    """A fresh execution context per test."""
    return fucina.ExecContext()
