# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
from typing import List, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn import ConvModule
from mmseg.models.decode_heads.decode_head import BaseDecodeHead
from mmseg.registry import MODELS
from torch import Tensor


class UpBlock(nn.Module):
    """Upsample to the skip's size, concatenate it, two conv-norm-ReLU."""

    def __init__(self, in_channels: int, skip_channels: int, out_channels: int,
                 conv_cfg, norm_cfg, act_cfg):
        super().__init__()
        self.convs = nn.Sequential(
            ConvModule(
                in_channels + skip_channels,
                out_channels,
                3,
                padding=1,
                conv_cfg=conv_cfg,
                norm_cfg=norm_cfg,
                act_cfg=act_cfg),
            ConvModule(
                out_channels,
                out_channels,
                3,
                padding=1,
                conv_cfg=conv_cfg,
                norm_cfg=norm_cfg,
                act_cfg=act_cfg))

    def forward(self, x: Tensor, skip_or_size) -> Tensor:
        if isinstance(skip_or_size, Tensor):
            x = F.interpolate(
                x,
                size=skip_or_size.shape[2:],
                mode='bilinear',
                align_corners=False)
            x = torch.cat([x, skip_or_size], dim=1)
        else:
            x = F.interpolate(
                x, size=skip_or_size, mode='bilinear', align_corners=False)
        return self.convs(x)


@MODELS.register_module()
class UNetHead(BaseDecodeHead):
    """UNet-style top-down decoder over a backbone's multi-scale features.

    From the deepest feature up: upsample to the next shallower feature,
    concatenate it, two conv-norm-ReLU; then ``extra_upsamples`` more
    blocks without skips (each doubling the size), so that a ResNet's
    stride-4 stage reaches full resolution with 2.

    Args:
        in_channels (Sequence[int]): Channels of the selected features,
            shallow to deep (``in_index`` selects them).
        decoder_channels (Sequence[int]): Output channels of each block,
            deep to shallow: ``len(in_channels) - 1 + extra_upsamples``
            entries. The last one must equal ``channels``.
        extra_upsamples (int): Blocks after the shallowest skip. Default: 2.
        **kwargs: Arguments of mmseg's ``BaseDecodeHead`` (channels,
            num_classes, in_index, norm_cfg, loss_decode, ...); the input
            transform is always 'multiple_select'.
    """

    def __init__(self,
                 in_channels: Sequence[int],
                 decoder_channels: Sequence[int],
                 extra_upsamples: int = 2,
                 **kwargs):
        kwargs.setdefault('input_transform', 'multiple_select')
        super().__init__(in_channels=list(in_channels), **kwargs)
        expected = len(in_channels) - 1 + extra_upsamples
        if len(decoder_channels) != expected:
            raise ValueError(
                f'decoder_channels={tuple(decoder_channels)} needs '
                f'{expected} entries (len(in_channels) - 1 + '
                f'extra_upsamples)')
        if decoder_channels[-1] != self.channels:
            raise ValueError(
                f'decoder_channels[-1]={decoder_channels[-1]} must equal '
                f'channels={self.channels}')
        skips = list(in_channels[-2::-1]) + [0] * extra_upsamples
        blocks: List[UpBlock] = []
        previous = in_channels[-1]
        for skip, out in zip(skips, decoder_channels):
            blocks.append(
                UpBlock(previous, skip, out, self.conv_cfg, self.norm_cfg,
                        self.act_cfg))
            previous = out
        self.up_blocks = nn.ModuleList(blocks)

    def forward(self, inputs: List[Tensor]) -> Tensor:
        feats = self._transform_inputs(inputs)
        x = feats[-1]
        skips = feats[-2::-1]
        for i, block in enumerate(self.up_blocks):
            if i < len(skips):
                x = block(x, skips[i])
            else:
                x = block(x, (x.shape[2] * 2, x.shape[3] * 2))
        return self.cls_seg(x)
