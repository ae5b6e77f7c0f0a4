# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""The recurrent state that KCLA carries from block to block."""
from typing import Any, NamedTuple, Optional

from torch import Tensor

# The official model adds this to Z before normalising the state.
STATE_EPS = 1e-3


class KCLAState(NamedTuple):
    """Recurrent state carried from block to block.

    Attributes:
        u (Tensor): Weighted sum of the block outputs seen so far, U^t, of
            shape (N, C, H, W); fp32 (fp64 in a float64 model) even when
            the activations are fp16/bf16.
        z (Tensor): Per-head normaliser Z^t = sum of the layer weights, of
            shape (N, num_heads), in the same precision as ``u``.
        tape (tuple, optional): ``(StateTape, step)`` where a recomputing
            train step (``'recompute'``, ``'compiled'``) made ``u``: what
            the next layer's backward pass recomputes ``u`` from instead of
            keeping it (:class:`.recompute.StateTape`). None elsewhere.
    """
    u: Tensor
    z: Tensor
    tape: Optional[Any] = None
