# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""The recurrent state that KCLA carries from block to block."""
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Optional, Tuple

from torch import Tensor

if TYPE_CHECKING:  # pragma: no cover
    from .recompute import StateTape

# The official model adds this to Z before normalising the state.
STATE_EPS = 1e-3


@dataclass(frozen=True, eq=False)
class KCLAState:
    """Recurrent state carried from block to block.

    It unpacks as the pair of the paper, ``u, z = state``.

    Attributes:
        u (Tensor): Weighted sum of the block outputs seen so far, U^t, of
            shape (N, C, H, W); fp32 (fp64 in a float64 model) even when
            the activations are fp16/bf16.
        z (Tensor): Per-head normaliser Z^t = sum of the layer weights, of
            shape (N, num_heads), in the same precision as ``u``.
        tape (tuple, optional): ``(StateTape, step)`` where a recomputing
            train step (``'recompute'``, ``'compiled'``) made ``u``: what
            the next layer's backward pass recomputes ``u`` from instead of
            keeping it (:class:`.recompute.StateTape`); None elsewhere.
    """
    u: Tensor
    z: Tensor
    tape: Optional[Tuple['StateTape', int]] = None

    def __iter__(self) -> Iterator[Tensor]:
        return iter((self.u, self.z))
