# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmseg.registry import MODELS


@MODELS.register_module()
class BCEDiceLoss(nn.Module):
    """The official ``BceDiceLoss`` of the paper's segmentation code, for a
    decode head with one output channel (``out_channels=1``).

    With ``p = sigmoid(logit)`` and ``t`` the 0/1 label of each pixel, over
    a batch of N images::

        bce  = mean over all pixels of the batch of
               -(t * max(log p, -100) + (1 - t) * max(log(1 - p), -100))
        dice = 1 - (1/N) * sum_n (2 * sum(p*t) + s) / (sum(p) + sum(t) + s)
        loss = bce_weight * bce + dice_weight * dice

    with the sums of ``dice`` over the pixels of image n and ``s = smooth``
    (official: 1). This is what the official code computes from its
    sigmoid output (``nn.BCELoss``, whose logarithms are clamped at -100,
    mean reduction; Dice per image, averaged over the batch), weights 1 and
    1. mmseg's ``DiceLoss`` on a one-channel output compares it with the
    background instead (it one-hot encodes the label and keeps channel 0),
    hence this loss. Pixels labelled ``ignore_index`` are left out of both
    terms. It is computed in float32 outside autocast (``binary_cross_
    entropy`` on probabilities is refused under autocast).

    ``avg_non_ignore`` and per-pixel ``weight`` are not supported.
    """

    def __init__(self,
                 bce_weight: float = 1.0,
                 dice_weight: float = 1.0,
                 smooth: float = 1.0,
                 loss_weight: float = 1.0,
                 loss_name: str = 'loss_bce_dice') -> None:
        super().__init__()
        self.bce_weight = bce_weight
        self.dice_weight = dice_weight
        self.smooth = smooth
        self.loss_weight = loss_weight
        self._loss_name = loss_name

    def forward(self,
                pred: torch.Tensor,
                target: torch.Tensor,
                weight: Optional[torch.Tensor] = None,
                ignore_index: Optional[int] = 255,
                **kwargs) -> torch.Tensor:
        """``pred``: logits (N, 1, H, W); ``target``: labels (N, H, W)."""
        if weight is not None:
            raise NotImplementedError('BCEDiceLoss takes no pixel weights')
        if pred.dim() != 4 or pred.shape[1] != 1:
            raise ValueError('BCEDiceLoss is for one output channel '
                             f'(N, 1, H, W), got {tuple(pred.shape)}')
        with torch.autocast(device_type=pred.device.type, enabled=False):
            prob = pred.float().sigmoid().flatten(1)
            label = target.flatten(1)
            valid = (
                label != ignore_index if ignore_index is not None else
                torch.ones_like(label, dtype=torch.bool))
            label = torch.where(valid, label, torch.zeros_like(label)).float()
            if (label > 1).any():
                raise ValueError('BCEDiceLoss: labels must be 0, 1 or '
                                 f'ignore_index ({ignore_index})')
            valid = valid.float()
            bce = F.binary_cross_entropy(prob, label, reduction='none')
            bce = (bce * valid).sum() / valid.sum().clamp(min=1)
            prob = prob * valid
            dice = ((2 * (prob * label).sum(1) + self.smooth) /
                    (prob.sum(1) + label.sum(1) + self.smooth))
            dice = 1 - dice.mean()
        return self.loss_weight * (
            self.bce_weight * bce + self.dice_weight * dice)

    @property
    def loss_name(self) -> str:
        return self._loss_name
