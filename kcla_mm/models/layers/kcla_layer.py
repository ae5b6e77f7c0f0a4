# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Key-Correlated Layer Attention (KCLA), arXiv 2606.28405.

The layer follows the official ImageNet model (github bgx666/KCLA,
``imagenet/kcla_resnet.py``) equation for equation, with three differences
that do not change the fp32 result:

* only the modules that the forward pass uses are built, so DDP does not need
  ``find_unused_parameters``;
* the recurrent state is accumulated in fp32 whatever the activations' dtype,
  because the official sum of ``exp(.)`` (up to e^10 per layer) overflows fp16
  after a few layers;
* the per-head ``gate / (Z + eps)`` scaling (and, in eval mode, the BN affine
  transform) is folded into the depthwise value conv, which is linear and
  per-channel, so the state is read once instead of three times.
"""
import math
from typing import NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn import build_conv_layer, build_norm_layer
from mmengine.model import BaseModule
from torch import Tensor
from torch.nn.modules.batchnorm import _BatchNorm

from ...torch_compat import is_autocast_enabled

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
    """
    u: Tensor
    z: Tensor


def _at_least_fp32(t: Tensor) -> Tensor:
    """fp16/bf16 -> fp32; fp32 and fp64 stay as they are."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def head_scaled_add(base: Optional[Tensor], scale: Tensor,
                    t: Tensor) -> Tensor:
    """``base + scale * t`` with one scale per (sample, head).

    ``t`` and ``base`` are (N, C, H, W), ``scale`` is (N, heads); the result
    has at least ``scale``'s precision (the state is never fp16) and, when
    ``t`` is channels_last, stays channels_last. For contiguous full
    precision this runs as a batched outer product: its backward gets the
    scale's gradient from a dot product, where an elementwise multiply
    would first write a state-sized product to memory.
    """
    n, heads = scale.shape
    if (t.dtype == scale.dtype and t.is_contiguous()
            and (base is None or base.is_contiguous())
            and not is_autocast_enabled(t.device.type)):
        flat = (n * heads, 1, -1)
        scale_3d = scale.reshape(n * heads, 1, 1)
        if base is None:
            out = torch.bmm(scale_3d, t.reshape(flat))
        else:
            out = torch.baddbmm(base.reshape(flat), scale_3d,
                                t.reshape(flat))
        return out.view(t.shape)
    # Elementwise with one scale per channel: a (N, heads, -1) reshape would
    # copy a channels_last tensor, and bmm would be autocast to fp16 (these
    # ops promote to the scale's fp32 instead).
    scale_4d = scale.repeat_interleave(t.shape[1] // heads, dim=1)[..., None,
                                                                   None]
    if base is None:
        return t * scale_4d
    return torch.addcmul(base, t, scale_4d)


def spatial_mean(x: Tensor) -> Tensor:
    """Global average pool to (N, C).

    ``sum / HW`` rather than ``mean``: mean's backward writes a full-size
    gradient, sum's is a broadcast view.
    """
    return x.sum((2, 3)) / (x.shape[2] * x.shape[3])


def eca_kernel_size(channels: int, gamma: int = 2, beta: int = 1) -> int:
    """Kernel size of an ECA 1-D conv over ``channels`` (always odd)."""
    t = int(abs((math.log(channels, 2) + beta) / gamma))
    return t if t % 2 else t + 1


def eca_conv1d(channels: int) -> nn.Conv1d:
    """A bias-free ECA-style 1-D conv over the pooled channels."""
    k_size = eca_kernel_size(channels)
    return nn.Conv1d(1, 1, k_size, padding=(k_size - 1) // 2, bias=False)


def check_branch_args(channels: int, head_dim: int, drop_path: float) -> None:
    """The checks every layer-attention branch makes of its arguments."""
    if head_dim <= 0 or channels % head_dim:
        raise ValueError(f'head_dim={head_dim} must divide the stage '
                         f'width channels={channels}')
    if not 0. <= drop_path < 1.:
        raise ValueError(f'drop_path={drop_path} must be in [0, 1)')


def build_state_adapter(conv_cfg: Optional[dict], state_channels: int,
                        channels: int, stride: int,
                        num_heads: int) -> nn.Module:
    """Algorithm 1's map of a state to a new stage: a 1x1 conv grouped by
    heads, with the stage's stride."""
    if state_channels % num_heads:
        raise ValueError(f'state_channels={state_channels} must be divisible '
                         f'by the number of heads {num_heads}')
    return build_conv_layer(
        conv_cfg,
        state_channels,
        channels,
        kernel_size=1,
        stride=stride,
        groups=num_heads,
        bias=False)


def add_branch(x: Tensor, branch: Tensor, drop_path: float,
               training: bool) -> Tensor:
    """x + DropPath(branch), per sample, out of place."""
    if training and drop_path > 0:
        keep = 1 - drop_path
        mask = x.new_empty((x.shape[0], 1, 1, 1)).bernoulli_(keep)
        return torch.addcmul(x, branch, mask.div_(keep))
    return x + branch


def head_temperatures(num_heads: int,
                      temperature_range: Sequence[float]) -> Tensor:
    """Per-head temperatures tau_h: reciprocals of a log-uniform sequence.

    Computed in fp32 exactly as the official code does, so that the values
    (and hence the layer weights) are bit-identical to it.
    """
    start, stop = temperature_range
    log_values = torch.linspace(
        torch.log(torch.tensor(float(start))),
        torch.log(torch.tensor(float(stop))), num_heads)
    return 1 / torch.exp(log_values)


class KCLALayer(BaseModule):
    """Key-Correlated Layer Attention after one residual block.

    Given the block output X^t and the state (U^{t-1}, Z^{t-1}), per head h
    of ``head_dim`` channels::

        q = GAP(X^t);  Q = conv1d_q(q);  K = conv1d_k(q)
        w_h = exp(min(||K_h|| / tau_h, clamp))
        U^t = U^{t-1} + w X^t;  Z^t = Z^{t-1} + w
        gate_h = sigmoid(Phi(||Q_h|| cos(Q_h, K_h)))
        X^t <- X^t + DropPath(ReLU(Norm(gate * DWConv3x3(U^t / (Z^t + eps)))))

    When ``renorm`` is set (first block of a stage, and the official extra
    block 11), the incoming state is first re-normalised (Algorithm 1 of the
    paper): A = U/Z, mapped by a head-grouped strided 1x1 conv to the new
    width and size when either changes, normalised, and a key conv on the
    pooled A gives a fresh Z, with U = A * Z.

    Args:
        channels (int): Channels of the block output X^t.
        head_dim (int): Channels per head. Default: 64.
        state_channels (int, optional): Channels of the incoming state when
            it differs from ``channels``. Default: None (same width).
        state_stride (int): Spatial stride between the incoming state and
            X^t. Default: 1.
        renorm (bool): Whether this layer re-normalises the incoming state.
            Default: False.
        temperature_range (Sequence[float]): The per-head temperatures are
            the reciprocals of a log-uniform sequence from
            ``temperature_range[0]`` to ``temperature_range[1]``.
            Default: (0.7, 1 / 0.7).
        clamp (float): Upper bound of ||K|| / tau before ``exp``. Default: 10.
        drop_path (float): Drop-path rate of the attention branch.
            Default: 0.2.
        conv_cfg (dict, optional): Config of the state adaptation conv.
            Default: None (nn.Conv2d).
        norm_cfg (dict): Config of the output and state norms.
            Default: dict(type='BN').
        init_cfg (dict or list[dict], optional): Initialization config.
    """

    def __init__(self,
                 channels: int,
                 head_dim: int = 64,
                 state_channels: Optional[int] = None,
                 state_stride: int = 1,
                 renorm: bool = False,
                 temperature_range: Sequence[float] = (0.7, 1 / 0.7),
                 clamp: float = 10.,
                 drop_path: float = 0.2,
                 conv_cfg: Optional[dict] = None,
                 norm_cfg: dict = dict(type='BN'),
                 init_cfg=(dict(type='Kaiming', layer='Conv2d'),
                           dict(
                               type='Xavier',
                               layer=['Conv1d', 'Linear'],
                               distribution='uniform'))):
        super().__init__(init_cfg=list(init_cfg) if isinstance(
            init_cfg, tuple) else init_cfg)
        check_branch_args(channels, head_dim, drop_path)
        self.channels = channels
        self.head_dim = head_dim
        self.num_heads = channels // head_dim
        self.clamp = float(clamp)
        self.drop_path = drop_path
        state_channels = channels if state_channels is None else state_channels

        self.query_conv = eca_conv1d(channels)
        self.key_conv = eca_conv1d(channels)
        self.value_conv = nn.Conv2d(
            channels, channels, 3, padding=1, groups=channels, bias=False)
        # Phi: the learnable map over heads of ||Q_h|| cos(theta_h).
        self.head_mix = nn.Linear(self.num_heads, self.num_heads, bias=False)
        self.norm = build_norm_layer(norm_cfg, channels)[1]
        # Fixed, but kept in the state dict so a checkpoint carries the
        # temperatures it was trained with.
        self.register_buffer(
            'tau', head_temperatures(self.num_heads, temperature_range))

        self.renorm = renorm
        if renorm:
            if state_channels != channels or state_stride != 1:
                self.state_adapt = build_state_adapter(
                    conv_cfg, state_channels, channels, state_stride,
                    self.num_heads)
            else:
                self.state_adapt = None
            self.state_norm = build_norm_layer(norm_cfg, channels)[1]
            self.state_key_conv = eca_conv1d(channels)
        elif state_channels != channels or state_stride != 1:
            raise ValueError('a layer whose state changes width or size '
                             'must have renorm=True')

    def _heads(self, t: Tensor) -> Tensor:
        """(N, C, H, W) -> (N, heads, head_dim, H, W), a view."""
        return t.view(t.shape[0], self.num_heads, self.head_dim, *t.shape[2:])

    def _layer_weight(self, k_norm: Tensor) -> Tensor:
        """w_h = exp(min(||K_h|| / tau_h, clamp)), shape (N, heads)."""
        return torch.exp(torch.clamp(k_norm / self.tau, max=self.clamp))

    def _pooled_conv(self, conv: nn.Conv1d, pooled: Tensor) -> Tensor:
        """ECA-style 1-D conv over the pooled channels, split into heads."""
        return _at_least_fp32(conv(pooled[:, None])).view(
            -1, self.num_heads, self.head_dim)

    def renormalise(self, state: KCLAState) -> KCLAState:
        """Algorithm 1: carry the state across a change of width or size."""
        # A = U / Z, with Z split into the previous stage's heads.
        a = head_scaled_add(None, state.z.reciprocal(), state.u)
        # The state is fp32; a half-precision model (no autocast) needs its
        # own dtype here.
        a = a.to(self.value_conv.weight.dtype)
        if self.state_adapt is not None:
            a = self.state_adapt(a)
        a = self.state_norm(a)
        key = self._pooled_conv(self.state_key_conv, spatial_mean(a))
        z = self._layer_weight(key.norm(dim=2))
        return KCLAState(head_scaled_add(None, z, a), z)

    def forward(self, x: Tensor,
                state: Optional[KCLAState]) -> Tuple[Tensor, KCLAState]:
        """Returns the updated block output and the new state.

        Without autograd, ``x`` and ``state`` are updated in place.
        """
        if state is not None and self.renorm:
            state = self.renormalise(state)

        # Q and K in one conv1d of two output channels: at batch 1 an op on
        # pooled vectors costs microseconds of dispatch, not of arithmetic.
        qk = F.conv1d(
            spatial_mean(x)[:, None],
            torch.cat([self.query_conv.weight, self.key_conv.weight]),
            padding=self.query_conv.padding)
        query, key = _at_least_fp32(qk).view(-1, 2, self.num_heads,
                                             self.head_dim).unbind(1)
        k_norm = torch.linalg.vector_norm(key, dim=2)
        weight = self._layer_weight(k_norm)
        # ||Q|| cos(theta) = <Q, K> / ||K||; the clamp only guards K = 0.
        q_cos = torch.linalg.vecdot(query, key) / k_norm.clamp_min(1e-12)
        gate = torch.sigmoid(
            _at_least_fp32(
                F.linear(
                    q_cos.to(self.head_mix.weight.dtype),
                    self.head_mix.weight)))

        if state is None:
            u, z = head_scaled_add(None, weight, x), weight
        elif torch.is_grad_enabled():
            u, z = head_scaled_add(state.u, weight, x), state.z + weight
        else:
            # Nothing else holds the old state in inference: update in place.
            u, z = state.u, state.z + weight
            self._heads(u).addcmul_(self._heads(x), weight[..., None, None,
                                                           None])
        # gate * DWConv(U / (Z + eps)) == DWConv(U * gate / (Z + eps)).
        out = self._value(u, gate / (z + STATE_EPS), x.dtype)
        if (self.training and self.drop_path > 0) or torch.is_grad_enabled():
            x = add_branch(x, out, self.drop_path, self.training)
        else:
            x = x.add_(out)
        return x, KCLAState(u, z)

    def _value(self, u: Tensor, scale: Tensor, dtype: torch.dtype) -> Tensor:
        """ReLU(Norm(DWConv(U * scale))), reading U once where possible.

        ``scale`` has shape (N, heads).
        """
        n, c = u.shape[:2]
        # A channels_last batch cannot merge N and C into one channel axis
        # for the per-sample fold below.
        if (u.dtype != dtype or is_autocast_enabled(u.device.type)
                or (n > 1 and not u.is_contiguous())):
            # The raw state may exceed the fp16 range: scale it first (the
            # scaled state is a convex mix of the block outputs).
            v = head_scaled_add(None, scale, u).to(dtype)
            return F.relu(self.norm(self.value_conv(v)), inplace=True)

        # Per-sample, per-channel scale folded into a depthwise kernel of
        # N * C groups: (N, heads, head_dim, 3, 3).
        weight = self._heads(self.value_conv.weight.view(1, c, 3, 3))
        weight = weight * scale[..., None, None, None]
        bias = None
        fold_norm = _is_frozen_bn(self.norm)
        if fold_norm:
            # Eval-mode BN is a per-channel affine map: fold it in too.
            bn_scale, bias = bn_affine(self.norm)
            weight = weight * self._heads(bn_scale.view(1, c, 1, 1))
            bias = bias.repeat(n) if n > 1 else bias
        v = F.conv2d(
            # At n = 1 the view would give a channels_last u an ambiguous
            # batch stride, and the conv would copy it to NCHW.
            u if n == 1 else u.view(1, n * c, *u.shape[2:]),
            weight.reshape(n * c, 1, 3, 3),
            bias,
            padding=1,
            groups=n * c)
        if fold_norm:
            # In place on the conv's own output, not on a view of it: an
            # in-place op on a view makes autograd copy the whole tensor
            # back (CopySlices) and hand the conv a strided gradient.
            return F.relu(v, inplace=True).view_as(u)
        return F.relu(self.norm(v.view_as(u)), inplace=True)


def _is_frozen_bn(norm: nn.Module) -> bool:
    """Whether ``norm`` is a BN that applies its running statistics."""
    return (isinstance(norm, _BatchNorm) and not norm.training
            and norm.track_running_stats)


def bn_affine(norm: _BatchNorm) -> Tuple[Tensor, Tensor]:
    """Eval-mode BN as y = scale * x + shift, per channel."""
    scale = torch.rsqrt(norm.running_var + norm.eps)
    if norm.weight is not None:
        scale = scale * norm.weight
    shift = -norm.running_mean * scale
    return scale, shift if norm.bias is None else shift + norm.bias
