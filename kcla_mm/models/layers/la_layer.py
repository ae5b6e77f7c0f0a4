# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Standard (full) layer attention (LA), the quadratic baseline of KCLA.

Written from the definition that the KCLA paper (arXiv 2606.28405) starts
from: the block outputs of the network are a sequence of tokens, and block t
attends, per head, to itself and to every earlier block with a softmax over
the layers. Everything but the aggregation rule is KCLA's, so that a
comparison of the two isolates that rule: the same ECA-style bias-free 1-D
convs over the pooled channels for Q and K, the same depthwise 3x3 value
conv on the aggregate, norm, ReLU and drop-path, and the same head-grouped
strided 1x1 conv + norm (the paper's Algorithm 1) at stage boundaries.
"""
import math
from typing import NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn import build_norm_layer
from mmengine.model import BaseModule
from torch import Tensor

from .attention_branch import (add_branch, build_state_adapter,
                               check_branch_args, eca_conv1d, full_precision,
                               head_scaled_add, init_cfg_list, pooled_conv,
                               scale_branch, spatial_mean, zero_branch_scale)


class LAState(NamedTuple):
    """The cache of all blocks seen so far, in the current stage's layout.

    Attributes:
        keys (Tensor): Keys of the T blocks so far, (N, T, C), fp32 (fp64 in
            a float64 model).
        values (tuple[Tensor]): The T block outputs (before their attention
            branch was added), each (N, C, H, W).
    """
    keys: Tensor
    values: Tuple[Tensor, ...]


class LALayer(BaseModule):
    """Standard layer attention after one residual block.

    Given the block output X^t and the cache of the earlier blocks' keys
    K_i and outputs X_i (i < t), per head h of ``head_dim`` channels::

        q = GAP(X^t);  Q^t = conv1d_q(q);  K_t = conv1d_k(q)
        a_{t,i} = softmax_i(<Q^t_h, K_{i,h}> / sqrt(head_dim)),  i = 1..t
        X^t <- X^t + DropPath(ReLU(Norm(DWConv3x3(sum_i a_{t,i} X_i))))

    and (K_t, X^t) joins the cache. The value conv is linear and per
    channel, so it is applied once to the aggregate rather than to every
    cached output (the same factoring KCLA uses). Every block keeps its own
    key and output, so the cache, and the work of the weighted sum, grow
    with the number of blocks: memory O(D) and compute O(D^2) in depth D.

    At the first block of a stage whose width or size changes, every cached
    output is mapped to the new stage by a head-grouped strided 1x1 conv and
    a norm (one shared map, as in KCLA's Algorithm 1), and its key is
    recomputed from the mapped output by a separate key conv, since the old
    keys live in the old width.

    Args:
        channels (int): Channels of the block output X^t.
        head_dim (int): Channels per head. Default: 64.
        state_channels (int, optional): Channels of the incoming cache when
            it differs from ``channels``. Default: None (same width).
        state_stride (int): Spatial stride between the cached outputs and
            X^t. Default: 1.
        drop_path (float): Drop-path rate of the attention branch.
            Default: 0.2.
        zero_init_branch (bool): Start the branch at zero through a
            learnable ``branch_scale`` (see :class:`.KCLALayer`).
            Default: False.
        conv_cfg (dict, optional): Config of the cache adaptation conv.
            Default: None (nn.Conv2d).
        norm_cfg (dict): Config of the output and cache norms.
            Default: dict(type='BN').
        init_cfg (dict or list[dict], optional): Initialization config.
    """

    def __init__(self,
                 channels: int,
                 head_dim: int = 64,
                 state_channels: Optional[int] = None,
                 state_stride: int = 1,
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

        if state_channels != channels or state_stride != 1:
            self.state_adapt = build_state_adapter(conv_cfg, state_channels,
                                                   channels, state_stride,
                                                   self.num_heads)
            self.state_norm = build_norm_layer(norm_cfg, channels)[1]
            self.state_key_conv = eca_conv1d(channels)
        else:
            self.state_adapt = None

    @staticmethod
    def _key(conv: nn.Conv1d, pooled: Tensor) -> Tensor:
        """ECA-style 1-D conv over pooled channels, (N, C) -> (N, C), at
        least fp32 (the softmax logits are accumulated in it; see
        :func:`.pooled_conv`)."""
        return pooled_conv(conv, pooled[:, None])[:, 0]

    def adapt(self, state: LAState) -> LAState:
        """Maps the whole cache to this stage's width and size."""
        values = torch.cat(state.values)
        values = self.state_norm(self.state_adapt(values))
        keys = self._key(self.state_key_conv, spatial_mean(values))
        n = state.values[0].shape[0]
        keys = keys.view(len(state.values), n, -1).transpose(0, 1)
        # unbind, not split(n): the same views, and a traced split(n)
        # records n as a constant (an ONNX graph then fails at another
        # batch size).
        values = values.reshape(len(state.values), n, *values.shape[1:])
        return LAState(keys, tuple(values.unbind(0)))

    def attention_weights(self, query: Tensor, keys: Tensor) -> Tensor:
        """Softmax over the T cached layers per head: (N, heads, T)."""
        n, t, _ = keys.shape
        query = query.view(n, self.num_heads, 1, self.head_dim)
        keys = keys.view(n, t, self.num_heads, self.head_dim).transpose(1, 2)
        # Autocast would run the matmul, and round the logits, in fp16.
        with full_precision(query.device.type):
            logits = (query @ keys.transpose(2, 3))[:, :, 0]
        return torch.softmax(logits / math.sqrt(self.head_dim), dim=-1)

    def forward(self, x: Tensor,
                state: Optional[LAState]) -> Tuple[Tensor, LAState]:
        """Returns the updated block output and the cache with this block
        appended."""
        if state is not None and self.state_adapt is not None:
            state = self.adapt(state)
        pooled = spatial_mean(x)
        query = self._key(self.query_conv, pooled)
        key = self._key(self.key_conv, pooled)
        if state is None:
            state = LAState(key[:, None], (x, ))
        else:
            state = LAState(
                torch.cat([state.keys, key[:, None]], 1), state.values + (x, ))
        weights = self.attention_weights(query, state.keys)
        # sum_i a_i X_i, one fused multiply-add per cached block.
        aggregate = None
        for i, value in enumerate(state.values):
            aggregate = head_scaled_add(aggregate, weights[..., i], value)
        out = F.relu(
            self.norm(self.value_conv(aggregate.to(x.dtype))), inplace=True)
        # Out of place: x itself is cached as this block's value.
        out = scale_branch(out, self.branch_scale)
        return add_branch(x, out, self.drop_path, self.training), state
