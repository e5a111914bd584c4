"""Optimizers, gradient clipping and learning-rate schedules (``torch.optim``'s shapes).

``SGD``, ``Adam`` and ``AdamW`` apply torch's update rules with torch's
defaults to lists of variables or of param groups; ``clip_grad_norm``
clips by the global L2 norm; :mod:`fucina.optim.lr` holds the schedules;
``save_state``/``load_state`` keep named parameters and optimizer state in
a safetensors file (resumable training).
Updates are fucina tensor ops under ``no_grad`` that write into the
parameters' own storage (:func:`fucina.optim.inplace.assign`).
"""

from . import lr
from .adam import Adam, AdamW
from .clip import clip_grad_norm
from .optimizer import Optimizer
from .sgd import SGD
from .state_file import load_state, save_state

__all__ = ["SGD", "Adam", "AdamW", "Optimizer", "clip_grad_norm", "load_state", "lr",
           "save_state"]
