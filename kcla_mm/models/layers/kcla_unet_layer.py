# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""The KCLA layer of the paper's segmentation network (UNet-KCLA).

The official segmentation code (github bgx666/KCLA,
``segmentation/models/kcla/kcla_forU.py``) builds its own, lighter variant
of the KCLA layer, not the ImageNet one that :class:`~.kcla.KCLALayer`
follows. :class:`KCLAUNetLayer` is that variant, written from its
equations, with one deliberate difference: the official file forgets the
carried state in every layer of a stage but the first (each such layer
starts a new sum from its own block output), while this layer carries it
through every block, as the paper's equations do and the rest of kcla_mm
does. ``carry_state=False`` reproduces the official behaviour, e.g. to
check a converted official checkpoint against the official outputs.

Only the reference formulation exists: the network is small (1.5M
parameters) and none of :class:`~.kcla.KCLALayer`'s fast paths apply.
"""
from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn
from mmcv.cnn import build_norm_layer
from mmengine.model import BaseModule
from torch import Tensor

from .attention_branch import (add_branch, build_state_adapter,
                               check_branch_args, eca_conv1d, init_cfg_list,
                               pooled_conv, scale_branch, spatial_mean,
                               zero_branch_scale)
from .kcla.layer import head_temperatures
from .kcla.state import KCLAState


class KCLAUNetLayer(BaseModule):
    """KCLA after one residual block of the official UNet-KCLA encoder.

    Given the block output X^t and the state (U^{t-1}, Z^{t-1}), per head h
    of ``head_dim`` channels::

        Q = conv1d_q(GAP(X^t));  K = conv1d_k(GAP(X^t))
        w_h = exp(min(||K_h|| / tau_h, clamp))
        U^t = U^{t-1} + w X^t;  Z^t = Z^{t-1} + w
        gate_h = sigmoid(<Q_h, K_h> / ||K_h||)
        X^t <- X^t + DropPath(Norm(gate * DWConv3x3(U^t / Z^t)))

    With ``renorm`` (the first block of every stage after the first), the
    incoming state is first carried to the new stage (the paper's
    Algorithm 1)::

        A = Norm_s(Adapt(U^{t-1} / Z^{t-1}))
        Z^{t-1} = exp(min(||conv1d_k(GAP(A))_h|| / tau_h, clamp))
        U^{t-1} = A Z^{t-1}

    How this differs from :class:`~.kcla.KCLALayer` (the ImageNet layer),
    each as the official segmentation file has it: no learnable map Phi
    over the heads before the gate's sigmoid; no ReLU after the branch's
    norm; no eps in U^t / Z^t; Algorithm 1 reuses the layer's own key conv
    (no separate one); Adapt, a 1x1 conv grouped by this layer's heads,
    has a bias and is built even where neither width nor size changes; and
    tau_h is the log-uniform sequence s_h itself (the ImageNet model uses
    1 / s_h: the same temperatures in reverse head order). The buffer
    ``inv_tau`` keeps 1 / tau_h, which the official file stores
    (``norm_d``) and multiplies by.

    Args:
        channels (int): Channels of the block output X^t.
        head_dim (int): Channels per head. Default: 16 (official).
        state_channels (int, optional): Channels of the incoming state when
            it differs from ``channels``. Default: None (same width).
        state_stride (int): Spatial stride between the incoming state and
            X^t. Default: 1.
        renorm (bool): Whether this layer carries the incoming state to a
            new stage (Algorithm 1). Default: False.
        carry_state (bool): Whether a layer without ``renorm`` adds to the
            incoming state (the paper). False forgets it, as the official
            file does: U^t = w X^t, Z^t = w. Default: True.
        temperature_range (Sequence[float]): s_h runs log-uniformly from
            ``temperature_range[0]`` to ``temperature_range[1]``.
            Default: (0.7, 1 / 0.7) (official).
        clamp (float): Upper bound of ||K|| / tau before ``exp``.
            Default: 10 (official).
        drop_path (float): Drop-path rate of the branch. Default: 0.2
            (official).
        zero_init_branch (bool): Scale the branch by a learnable
            per-channel ``branch_scale`` that starts at 0 (see
            :class:`~.kcla.KCLALayer`). Default: False.
        conv_cfg (dict, optional): Config of Adapt. Default: None
            (nn.Conv2d).
        norm_cfg (dict): Config of the branch's and the state's norms.
            Default: dict(type='BN').
        init_cfg (dict or list[dict], optional): Initialization config.
            Default: Kaiming (fan_out, ReLU) for the 2-D convs, PyTorch's
            own init for the 1-D ones, as the official network.
    """

    def __init__(self,
                 channels: int,
                 head_dim: int = 16,
                 state_channels: Optional[int] = None,
                 state_stride: int = 1,
                 renorm: bool = False,
                 carry_state: bool = True,
                 temperature_range: Sequence[float] = (0.7, 1 / 0.7),
                 clamp: float = 10.,
                 drop_path: float = 0.2,
                 zero_init_branch: bool = False,
                 conv_cfg: Optional[dict] = None,
                 norm_cfg: dict = dict(type='BN'),
                 init_cfg=dict(type='Kaiming', layer='Conv2d')):
        super().__init__(init_cfg=init_cfg_list(init_cfg))
        check_branch_args(channels, head_dim, drop_path)
        self.channels = channels
        self.head_dim = head_dim
        self.num_heads = channels // head_dim
        self.clamp = float(clamp)
        self.drop_path = drop_path
        self.carry_state = bool(carry_state)
        state_channels = channels if state_channels is None else state_channels

        self.query_conv = eca_conv1d(channels)
        self.key_conv = eca_conv1d(channels)
        self.value_conv = nn.Conv2d(
            channels, channels, 3, padding=1, groups=channels, bias=False)
        self.norm = build_norm_layer(norm_cfg, channels)[1]
        self.branch_scale = zero_branch_scale(channels, zero_init_branch)
        # 1 / tau_h; fixed, but in the state dict so that a checkpoint
        # carries the temperatures it was trained with.
        self.register_buffer(
            'inv_tau', head_temperatures(self.num_heads, temperature_range))

        self.renorm = renorm
        if renorm:
            self.state_adapt = build_state_adapter(
                conv_cfg,
                state_channels,
                channels,
                state_stride,
                self.num_heads,
                bias=True)
            self.state_norm = build_norm_layer(norm_cfg, channels)[1]
        elif state_channels != channels or state_stride != 1:
            raise ValueError('a layer whose state changes width or size '
                             'must have renorm=True')

    def split_heads(self, t: Tensor) -> Tensor:
        """(N, C, ...) -> (N, heads, head_dim, ...), a view."""
        return t.view(t.shape[0], self.num_heads, self.head_dim, *t.shape[2:])

    def key_weight(self, key: Tensor) -> Tensor:
        """w_h = exp(min(||K_h|| / tau_h, clamp)) for ``key`` of shape
        (N, heads, head_dim); returns (N, heads)."""
        key_norm = torch.linalg.vector_norm(key, dim=2)
        return torch.exp(torch.clamp(key_norm * self.inv_tau, max=self.clamp))

    def pooled_key(self, x: Tensor) -> Tensor:
        """conv1d_k(GAP(x)), (N, heads, head_dim), at least fp32."""
        return self.split_heads(
            pooled_conv(self.key_conv,
                        spatial_mean(x)[:, None])[:, 0])

    def renormalise(self, state: KCLAState) -> KCLAState:
        """Algorithm 1: the incoming state carried to this stage."""
        u, z = state.u, state.z
        n, heads_in = z.shape
        a = (u.view(n, heads_in, -1, *u.shape[2:]) /
             z[..., None, None, None]).flatten(1, 2)
        a = self.state_norm(
            self.state_adapt(a.to(self.value_conv.weight.dtype)))
        z = self.key_weight(self.pooled_key(a))
        u = (self.split_heads(a) * z[..., None, None, None]).flatten(1, 2)
        return KCLAState(u, z)

    def forward(self, x: Tensor,
                state: Optional[KCLAState]) -> Tuple[Tensor, KCLAState]:
        """Returns the updated block output and the new state.

        Args:
            x (Tensor): The block output X^t, (N, C, H, W).
            state (KCLAState, optional): (U^{t-1}, Z^{t-1}); None at the
                network's first block.
        """
        if state is not None:
            if self.renorm:
                state = self.renormalise(state)
            elif not self.carry_state:
                state = None
        pooled = spatial_mean(x)[:, None]
        query = self.split_heads(pooled_conv(self.query_conv, pooled)[:, 0])
        key = self.split_heads(pooled_conv(self.key_conv, pooled)[:, 0])
        w = self.key_weight(key)
        # U^t = U^{t-1} + w X^t;  Z^t = Z^{t-1} + w (in at least fp32)
        u = self.split_heads(x) * w[..., None, None, None]
        z = w
        if state is not None:
            u = self.split_heads(state.u) + u
            z = state.z + z
        u = u.flatten(1, 2)
        # gate_h = sigmoid(||Q_h|| cos(Q_h, K_h)); the clamp guards K = 0.
        key_norm = torch.linalg.vector_norm(key, dim=2)
        gate = torch.sigmoid((query * key).sum(2) / key_norm.clamp_min(1e-12))
        a = self.split_heads(u) / z[..., None, None, None]
        v = self.split_heads(self.value_conv(a.flatten(1, 2).to(x.dtype)))
        v = (v * gate[..., None, None, None].to(v.dtype)).flatten(1, 2)
        out = scale_branch(self.norm(v), self.branch_scale)
        return add_branch(x, out, self.drop_path,
                          self.training), KCLAState(u, z)
