# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""The decoder of the paper's segmentation network (UNet-KCLA)."""
from collections import OrderedDict
from typing import List, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn import build_activation_layer, build_conv_layer, build_norm_layer
from mmseg.models.decode_heads.decode_head import BaseDecodeHead
from mmseg.registry import MODELS
from torch import Tensor

from ...torch_compat import is_exporting


def pad_to(x: Tensor, size: Sequence[int]) -> Tensor:
    """``x`` padded with zeros, or cropped where it is larger, to ``size``
    (H, W), centred: the official ``Up`` pads by the size difference ``d``
    with ``F.pad``, whose negative padding crops, ``d // 2`` before.

    ``d // 2`` is computed as ``(size + x's) // 2 - x's``, the same floor
    with a numerator that is never negative: an exported graph divides
    integers by truncating, which moved a crop by one pixel wherever a
    stage's size was odd. And while a graph is recorded there is no early
    return for equal sizes, which the recorder would keep for every size.
    """
    h, w = x.shape[2], x.shape[3]
    if not is_exporting() and (h, w) == tuple(size):
        return x
    top = (size[0] + h) // 2 - h
    left = (size[1] + w) // 2 - w
    return F.pad(x, [left, size[1] - w - left, top, size[0] - h - top])


def conv_norm_act(in_channels: int, out_channels: int,
                  conv_cfg: Optional[dict], norm_cfg: Optional[dict],
                  act_cfg: Optional[dict]) -> nn.Sequential:
    """conv3x3 with a bias (as the official one, although a norm follows),
    norm, activation; keys ``conv``, the norm's name (``bn`` for BN) and
    ``activate``, as mmcv's ``ConvModule`` names them (which would warn
    about the bias)."""
    layers = OrderedDict(
        conv=build_conv_layer(
            conv_cfg, in_channels, out_channels, 3, padding=1, bias=True))
    if norm_cfg is not None:
        name, norm = build_norm_layer(norm_cfg, out_channels)
        layers[name] = norm
    if act_cfg is not None:
        layers['activate'] = build_activation_layer(act_cfg)
    return nn.Sequential(layers)


class UNetPaperUp(nn.Module):
    """One step of the official decoder (its ``Up``): bilinear x2 with
    ``align_corners=True``, pad or crop to the skip's size, concatenate
    skip first, then two conv3x3 (with bias) - norm - ReLU."""

    def __init__(self, in_channels: int, out_channels: int, conv_cfg, norm_cfg,
                 act_cfg):
        super().__init__()
        self.convs = nn.Sequential(*[
            conv_norm_act(channels, out_channels, conv_cfg, norm_cfg, act_cfg)
            for channels in (in_channels, out_channels)
        ])

    def forward(self, x: Tensor, skip: Tensor) -> Tensor:
        x = F.interpolate(
            x, scale_factor=2, mode='bilinear', align_corners=True)
        x = torch.cat([skip, pad_to(x, skip.shape[2:])], dim=1)
        return self.convs(x)


@MODELS.register_module()
class UNetPaperHead(BaseDecodeHead):
    """The decoder of the official UNet-KCLA network (github bgx666/KCLA,
    ``segmentation/models/UNet_kcla.py``).

    From the deepest feature up, each step (:class:`UNetPaperUp`, the
    official ``Up``) doubles the size bilinearly (``align_corners=True``),
    pads or crops it to the next shallower feature, concatenates that
    feature in front of it and applies two conv3x3-norm-ReLU; ``conv_seg``
    (the official ``outc``) maps the last step's output to the classes.
    With the official encoder (:class:`~kcla_mm.models.backbones.
    KCLAResNetUNetPaper`) the five features are 16x256x256 to 128x32x32
    for a 256x256 image, and the steps are the official ``Up(256, 64)``,
    ``Up(128, 32)``, ``Up(64, 16)``, ``Up(32, 16)``. The last two features
    have the same size (the last stage has stride 1): the first step, as
    the official one, doubles the deepest feature and crops the centre
    back, which resamples it.

    The official network has one sigmoid output: ``num_classes=2,
    out_channels=1, threshold=0.5`` with a sigmoid loss (as the base
    configs ``configs/_base_/models/unet-paper_*.py``); ``dropout_ratio``
    should be 0 (no dropout there).

    Args:
        in_channels (Sequence[int]): Channels of the selected features,
            shallow to deep (``in_index`` selects them).
        decoder_channels (Sequence[int]): Output channels of each step,
            deep to shallow: ``len(in_channels) - 1`` entries, the last
            equal to ``channels``. Default: (64, 32, 16, 16) (official).
        **kwargs: Arguments of mmseg's ``BaseDecodeHead`` (channels,
            num_classes, out_channels, threshold, in_index, norm_cfg,
            loss_decode, ...); the input transform is always
            'multiple_select'.
    """

    def __init__(self,
                 in_channels: Sequence[int],
                 decoder_channels: Sequence[int] = (64, 32, 16, 16),
                 **kwargs):
        if kwargs.setdefault('input_transform',
                             'multiple_select') != 'multiple_select':
            raise ValueError(
                f"input_transform={kwargs['input_transform']!r}: "
                "UNetPaperHead reads every feature ('multiple_select')")
        if (not isinstance(in_channels, Sequence) or len(in_channels) < 2):
            raise ValueError(f'in_channels={in_channels!r} must list at '
                             'least two features, shallow to deep')
        super().__init__(in_channels=list(in_channels), **kwargs)
        if len(decoder_channels) != len(in_channels) - 1:
            raise ValueError(
                f'decoder_channels={tuple(decoder_channels)} needs '
                f'{len(in_channels) - 1} entries (len(in_channels) - 1)')
        if decoder_channels[-1] != self.channels:
            raise ValueError(
                f'decoder_channels[-1]={decoder_channels[-1]} must equal '
                f'channels={self.channels}')
        steps: List[UNetPaperUp] = []
        previous = in_channels[-1]
        for skip, out in zip(in_channels[-2::-1], decoder_channels):
            steps.append(
                UNetPaperUp(skip + previous, out, self.conv_cfg, self.norm_cfg,
                            self.act_cfg))
            previous = out
        self.up_steps = nn.ModuleList(steps)

    def forward(self, inputs: List[Tensor]) -> Tensor:
        feats = self._transform_inputs(inputs)
        x = feats[-1]
        for step, skip in zip(self.up_steps, feats[-2::-1]):
            x = step(x, skip)
        return self.cls_seg(x)
