# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""MRLA-light: multi-head recurrent layer attention, light version.

Fang et al., "Cross-Layer Retrospective Retrieving via Layer Attention",
ICLR 2023 (github joyfang1106/MRLA), the linear baseline of the KCLA paper.
Re-implemented from the paper's light recurrence (its Eq. 8 figure,
``figures/MRLA_eq8.png``; module ``resnet/models/modules/
mrla_light_module.py`` and block ``resnet/models/resnet_mrla_light.py``)::

    O^t = sigmoid(<Q^t_h, K^t_h> / sqrt(d)) V^t_h  +  lambda^t * O^{t-1}
    X^t <- X^t + DropPath(Norm(O^t))

with Q, K ECA-style 1-D convs over the pooled block output, V a depthwise
3x3 conv of it and lambda^t a learnable per-channel decay. Unrolled, block
i reaches block t with the coefficient gate_i * prod_{j=i+1..t} lambda^j:
earlier layers fade geometrically, which is the KCLA paper's point.
"""
import math
from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn
from mmcv.cnn import build_norm_layer
from mmengine.model import BaseModule
from torch import Tensor

from .attention_branch import (add_branch, build_state_adapter,
                               check_branch_args, eca_conv1d, head_scaled_add,
                               init_cfg_list, pooled_conv, scale_branch,
                               spatial_mean, zero_branch_scale)


class MRLALightLayer(BaseModule):
    """MRLA-light after one residual block; the state is O^{t-1}.

    Two choices differ from the official code, both to follow the equation
    and to share KCLA's cross-stage handling:

    * The official block passes its own (downsampled) input as O^{t-1}; here
      the previous block's attention output O^{t-1} itself is carried, so
      ``decay`` is exactly the paper's lambda^t and the effective coefficient
      of block i at block t is the product of the decays in between.
    * At a change of width or size O^{t-1} is mapped by a head-grouped
      strided 1x1 conv and a norm, as KCLA's Algorithm 1 maps its state
      (the official block relies on the block's shortcut projection).

    Args:
        channels (int): Channels of the block output X^t.
        head_dim (int): Channels per head. Default: 32 (official).
        state_channels (int, optional): Channels of the incoming O^{t-1}
            when it differs from ``channels``. Default: None (same width).
        state_stride (int): Spatial stride between O^{t-1} and X^t.
            Default: 1.
        receives_state (bool): Whether an O^{t-1} arrives; False for the
            network's first block, which then builds no decay (a parameter
            without gradient would force DDP's find_unused_parameters).
            Default: True.
        drop_path (float): Drop-path rate of the attention branch.
            Default: 0.2 (official ImageNet training).
        zero_init_branch (bool): Start the branch at zero through a
            learnable ``branch_scale`` (see :class:`.KCLALayer`). This
            branch has no ReLU after its norm, so a zero norm weight would
            train here, but the scale keeps one mechanism for the three
            layers. Default: False.
        conv_cfg (dict, optional): Config of the state adaptation conv.
            Default: None (nn.Conv2d).
        norm_cfg (dict): Config of the output and state norms.
            Default: dict(type='BN').
        init_cfg (dict or list[dict], optional): Initialization config. The
            decay lambda^t is drawn from N(0, 1) at construction, as in the
            official code.
    """

    def __init__(self,
                 channels: int,
                 head_dim: int = 32,
                 state_channels: Optional[int] = None,
                 state_stride: int = 1,
                 receives_state: bool = True,
                 drop_path: float = 0.2,
                 zero_init_branch: bool = False,
                 conv_cfg: Optional[dict] = None,
                 norm_cfg: dict = dict(type='BN'),
                 init_cfg: Sequence[dict] = (dict(
                     type='Kaiming', layer='Conv2d'),
                                             dict(
                                                 type='Xavier',
                                                 layer='Conv1d',
                                                 distribution='uniform'))):
        super().__init__(init_cfg=init_cfg_list(init_cfg))
        check_branch_args(channels, head_dim, drop_path)
        self.channels = channels
        self.head_dim = head_dim
        self.num_heads = channels // head_dim
        self.drop_path = drop_path
        state_channels = channels if state_channels is None else state_channels

        self.query_conv = eca_conv1d(channels)
        self.key_conv = eca_conv1d(channels)
        self.value_conv = nn.Conv2d(
            channels, channels, 3, padding=1, groups=channels, bias=False)
        self.norm = build_norm_layer(norm_cfg, channels)[1]
        self.branch_scale = zero_branch_scale(channels, zero_init_branch)
        # lambda^t, one per channel.
        self.decay = nn.Parameter(
            torch.randn(channels)) if receives_state else None
        if not receives_state:
            if state_channels != channels or state_stride != 1:
                raise ValueError('a layer with receives_state=False takes no '
                                 'state_channels or state_stride')
            self.state_adapt = None
        elif state_channels != channels or state_stride != 1:
            self.state_adapt = build_state_adapter(conv_cfg, state_channels,
                                                   channels, state_stride,
                                                   self.num_heads)
            self.state_norm = build_norm_layer(norm_cfg, channels)[1]
        else:
            self.state_adapt = None

    def gate(self, x: Tensor) -> Tensor:
        """sigmoid(<Q_h, K_h> / sqrt(head_dim)) of a block output, the
        weight of its own value, (N, heads), computed in at least fp32 from
        the fp32 pooled vector (see :func:`.spatial_mean`)."""
        pooled = spatial_mean(x)[:, None]
        shape = (x.shape[0], self.num_heads, self.head_dim)
        query = pooled_conv(self.query_conv, pooled).view(shape)
        key = pooled_conv(self.key_conv, pooled).view(shape)
        return torch.sigmoid((query * key).sum(2) / math.sqrt(self.head_dim))

    def adapt(self, state: Tensor) -> Tensor:
        """O^{t-1} in this block's width and size."""
        if self.state_adapt is None:
            return state
        return self.state_norm(self.state_adapt(state))

    def forward(self, x: Tensor,
                state: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
        """Returns the updated block output and O^t."""
        out = head_scaled_add(None,
                              self.gate(x).to(x.dtype), self.value_conv(x))
        if state is not None:
            if self.decay is None:
                raise ValueError('this layer was built with '
                                 'receives_state=False but got a state')
            out = torch.addcmul(out, self.adapt(state),
                                self.decay.view(1, -1, 1, 1).to(out.dtype))
        branch = scale_branch(self.norm(out), self.branch_scale)
        return add_branch(x, branch, self.drop_path, self.training), out
