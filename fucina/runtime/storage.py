"""Refcounted flat storage shared by a tensor and its views."""

from __future__ import annotations

import numpy as np


class Storage:
    """A flat numpy buffer plus the owner count of the tensors viewing it.

    Memory itself is reclaimed by Python's garbage collector; the count makes
    ownership observable (views retain, deinit releases) as in the seeds.
    """

    __slots__ = ("buf", "refs", "readonly", "borrowed")

    def __init__(self, buf: np.ndarray | None, *, readonly: bool = False, borrowed: bool = False):
        self.buf = buf
        self.refs = 1
        self.readonly = readonly
        self.borrowed = borrowed

    def retain(self) -> Storage:
        """Add one owner."""
        self.refs += 1
        return self

    def release(self) -> None:
        """Drop one owner."""
        if self.refs > 0:
            self.refs -= 1
