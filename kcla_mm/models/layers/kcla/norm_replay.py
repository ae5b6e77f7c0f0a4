# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""A KCLA layer's norm as one forward call applied it, for the replay of
that call in backward (:mod:`.recompute`)."""
from typing import Optional

import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from torch.nn.modules.batchnorm import _BatchNorm

from ..attention_branch import is_frozen_bn


class NormReplay:
    """``norm`` as the forward call that made it applied it, and that
    leaves the running statistics alone.

    Taken when the forward runs, so that the backward's replay gives the
    forward's output whatever happened in between: the model switched to
    ``eval()`` or ``train()`` (autograd differentiates the function the
    forward computed, as PyTorch's own BN does), or a later train forward
    that updated the running statistics in place (they are copied where
    the forward applied them: C values each). A training BN replays with
    the batch's statistics, which the replay recomputes exactly, without
    updating the running ones a second time. Other norms (GN, LN) have no
    mode or statistics and are called as they are.

    Where it applies running statistics it offers them as a frozen BN
    does (``running_mean``, ``running_var``, ``eps``, ``weight``,
    ``bias``), so that :func:`..attention_branch.bn_affine` folds it as
    the forward folded the module. ``weight`` and ``bias`` are read from
    the module at the replay, where the replay binds the tensors the
    forward saved.
    """

    def __init__(self, norm: nn.Module):
        self.norm = norm
        self.frozen = is_frozen_bn(norm)
        self.batch_stats = isinstance(norm, _BatchNorm) and not self.frozen
        self.running_mean: Optional[Tensor] = None
        self.running_var: Optional[Tensor] = None
        if self.frozen:
            self.running_mean = norm.running_mean.clone()
            self.running_var = norm.running_var.clone()

    @property
    def weight(self) -> Optional[Tensor]:
        return self.norm.weight

    @property
    def bias(self) -> Optional[Tensor]:
        return self.norm.bias

    @property
    def eps(self) -> float:
        return self.norm.eps

    def __call__(self, v: Tensor) -> Tensor:
        if self.frozen or self.batch_stats:
            return F.batch_norm(v, self.running_mean, self.running_var,
                                self.weight, self.bias, self.batch_stats, 0.,
                                self.eps)
        return self.norm(v)


def applies_running_statistics(norm) -> bool:
    """Whether ``norm``, a module or a :class:`NormReplay`, normalises with
    running statistics (a per-channel affine map that can be folded)."""
    return norm.frozen if isinstance(norm, NormReplay) else is_frozen_bn(norm)
