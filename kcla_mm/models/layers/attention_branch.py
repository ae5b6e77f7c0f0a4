# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""What the three layer-attention layers (KCLA, LA, MRLA-light) are built
from: the pooled-channel convs, argument checks, the state adapter of the
paper's Algorithm 1, the drop-path residual and a few tensor helpers.

Sharing them keeps a comparison of the three layers a comparison of their
aggregation rules only.
"""
import contextlib
import math
from typing import ContextManager, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn import build_conv_layer
from torch import Tensor
from torch.nn.modules.batchnorm import _BatchNorm

from ...torch_compat import is_autocast_enabled, is_exporting


def spatial_mean(x: Tensor) -> Tensor:
    """Global average pool to (N, C), summed and returned in at least fp32
    (fp64 stays fp64).

    An fp16 sum over H x W passes 65504 as soon as a channel of a
    256 x 256 map averages 1.0 (a stage-1 map of a 1333 x 800 image has
    66,800 pixels): inf there makes the key norm inf and the state NaN.
    An fp32 input is summed as it is, without a copy. ``sum / HW`` rather
    than ``mean``: mean's backward writes a full-size gradient, sum's is a
    broadcast view (cast back to ``x``'s dtype).
    """
    acc_dtype = torch.promote_types(x.dtype, torch.float32)
    return x.sum((2, 3), dtype=acc_dtype) / (x.shape[2] * x.shape[3])


def full_precision(device_type: str) -> ContextManager:
    """Autocast off, where it is on, for ops on pooled vectors.

    Autocast runs conv1d, linear and matmul in fp16/bf16 whatever their
    inputs' dtype; the pooled statistics, keys, queries and the logits and
    norms made from them are (N, C)-sized, so keeping them in fp32 costs
    nothing measurable, and a key rounded to fp16 would put its error,
    times up to 10 (the clamp), into ``exp(||K|| / tau)``.
    """
    if is_autocast_enabled(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


def pooled_conv(conv: nn.Conv1d, pooled: Tensor) -> Tensor:
    """``conv(pooled)`` over pooled channels (N, 1, C) in ``pooled``'s dtype
    (at least fp32, see :func:`spatial_mean`), whatever autocast and the
    conv's weight dtype (a ``.half()`` model) are; the module itself runs
    where neither interferes, so that its hooks see the call."""
    if (conv.weight.dtype == pooled.dtype
            and not is_autocast_enabled(pooled.device.type)):
        return conv(pooled)
    bias = None if conv.bias is None else conv.bias.to(pooled.dtype)
    with full_precision(pooled.device.type):
        return F.conv1d(pooled, conv.weight.to(pooled.dtype), bias,
                        conv.stride, conv.padding, conv.dilation, conv.groups)


def pooled_linear(t: Tensor, weight: Tensor) -> Tensor:
    """``F.linear(t, weight)`` (no bias) on a pooled-vector statistic, in
    ``t``'s dtype whatever autocast and ``weight``'s dtype are (see
    :func:`pooled_conv`)."""
    with full_precision(t.device.type):
        return F.linear(t, weight.to(t.dtype))


def eca_kernel_size(channels: int, gamma: int = 2, beta: int = 1) -> int:
    """Kernel size of an ECA 1-D conv over ``channels`` (always odd)."""
    t = int(abs((math.log(channels, 2) + beta) / gamma))
    return t if t % 2 else t + 1


def eca_conv1d(channels: int) -> nn.Conv1d:
    """A bias-free ECA-style 1-D conv over the pooled channels."""
    k_size = eca_kernel_size(channels)
    return nn.Conv1d(1, 1, k_size, padding=(k_size - 1) // 2, bias=False)


def init_cfg_list(
    init_cfg: Union[dict, Sequence[dict],
                    None]) -> Union[dict, List[dict], None]:
    """``init_cfg`` as mmengine's BaseModule takes it (a dict or a list):
    the layers' defaults are tuples, so that no call shares a mutable
    default."""
    return list(init_cfg) if isinstance(init_cfg, tuple) else init_cfg


def check_branch_args(channels: int, head_dim: int, drop_path: float) -> None:
    """The checks every layer-attention branch makes of its arguments."""
    if head_dim <= 0 or channels % head_dim:
        raise ValueError(f'head_dim={head_dim} must divide the stage '
                         f'width channels={channels}')
    if not 0. <= drop_path < 1.:
        raise ValueError(f'drop_path={drop_path} must be in [0, 1)')


def build_state_adapter(conv_cfg: Optional[dict],
                        state_channels: int,
                        channels: int,
                        stride: int,
                        num_heads: int,
                        bias: bool = False) -> nn.Module:
    """Algorithm 1's map of a state to a new stage: a 1x1 conv grouped by
    heads, with the stage's stride; without bias (the ImageNet layers) unless
    ``bias`` (the UNet-KCLA layer, as its official file)."""
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
        bias=bias)


def is_plain_pointwise(conv: Optional[nn.Module]) -> bool:
    """Whether ``conv`` is a bias-free 1x1 ``nn.Conv2d`` without padding or
    dilation, as :func:`build_state_adapter` builds it by default."""
    return (type(conv) is nn.Conv2d and conv.kernel_size == (1, 1)
            and conv.padding == (0, 0) and conv.dilation == (1, 1)
            and conv.bias is None)


def matmul_adapts(adapter: Optional[nn.Module], a: Tensor) -> bool:
    """Whether :func:`adapt_state` and :func:`scaled_adapt` run ``adapter``
    as a batched matmul over the strided input: a plain adapter, a
    contiguous input, no autocast and no tracing (FLOP counts and exports
    keep the conv)."""
    return (is_plain_pointwise(adapter) and a.is_contiguous()
            and not is_autocast_enabled(a.device.type) and not is_exporting())


def adapt_state(adapter: Optional[nn.Module], a: Tensor) -> Tensor:
    """``adapter(a)`` (None: ``a``), as a batched matmul where
    :func:`matmul_adapts`: on the CPU 2-3x faster than the grouped conv,
    forward and backward (benchmarks.md). Other cases run the module."""
    if adapter is None or not matmul_adapts(adapter, a):
        return a if adapter is None else adapter(a)
    groups, c_out = adapter.groups, adapter.out_channels
    sub, (h, w) = grouped_strided_input(adapter, a)
    out = torch.matmul(
        adapter.weight.view(groups, c_out // groups, sub.shape[2]), sub)
    return out.view(a.shape[0], c_out, h, w)


def scaled_adapt(adapter: nn.Conv2d, a: Tensor, in_scale: Tensor) -> Tensor:
    """``adapter(a * in_scale[..., None, None])`` for a plain adapter
    (:func:`matmul_adapts`) and one scale per (sample, input channel):
    the scale goes into per-sample copies of the adapter's weights, so that
    it is applied to the weights instead of to every value of ``a`` (whose
    size is 4x the output's at stride 2), forward and backward."""
    return adapt_strided(adapter, *grouped_strided_input(adapter, a), in_scale)


def adapt_strided(adapter: nn.Conv2d, sub: Tensor, size: Tuple[int, int],
                  in_scale: Tensor) -> Tensor:
    """:func:`scaled_adapt` from what the adapter reads of ``a``: ``sub``
    and ``size`` as :func:`grouped_strided_input` gives them."""
    weight = per_sample_weight(adapter, in_scale)
    return (weight @ sub).view(in_scale.shape[0], adapter.out_channels, *size)


def per_sample_weight(adapter: nn.Conv2d, in_scale: Tensor) -> Tensor:
    """A plain adapter's weights with one scale per (sample, input
    channel) applied, as (N, groups, C_out / groups, C_in / groups), the
    matmul operand of :func:`grouped_strided_input`'s view."""
    n, c_in = in_scale.shape
    groups, c_out = adapter.groups, adapter.out_channels
    return (adapter.weight.view(1, groups, c_out // groups, c_in // groups) *
            in_scale.view(n, groups, 1, c_in // groups))


def grouped_strided_input(adapter: nn.Conv2d,
                          a: Tensor) -> Tuple[Tensor, Tuple[int, int]]:
    """What a plain adapter's groups read of ``a``, as a contiguous
    (N, groups, C_in / groups, H' W'), and its size (H', W')."""
    sub = a[:, :, ::adapter.stride[0], ::adapter.stride[1]]
    n, c_in, h, w = sub.shape
    return sub.reshape(n, adapter.groups, c_in // adapter.groups,
                       h * w), (h, w)


def zero_branch_scale(channels: int, enabled: bool) -> Optional[nn.Parameter]:
    """The per-channel scale of a branch that starts at zero, or None.

    Starting every layer-attention branch at zero makes a backbone loaded
    from plain ResNet weights compute exactly the plain ResNet's features
    at step 0. KCLA's and LA's branches end in ``ReLU(Norm(.))``: for their
    output to be exactly 0 for every input, the ReLU's input must be <= 0
    everywhere, where its gradient is 0, so any zero start before the ReLU
    (the norm's weight and bias at 0, as mmdet's ``zero_init_residual`` does
    for a block's last BN, or a zero value conv) leaves the norm and
    everything before it without a gradient for good. A learnable scale
    after the ReLU (as LayerScale / SkipInit) gets the branch output as its
    gradient, and once it leaves 0 the rest of the branch trains too.
    MRLA-light's branch, ``Norm(.)`` without a ReLU, would train from a zero
    norm weight, but uses the same scale, so that the option means the same
    thing for all three layers.
    """
    return nn.Parameter(torch.zeros(channels)) if enabled else None


def scale_branch(branch: Tensor, scale: Optional[Tensor]) -> Tensor:
    """``branch`` times the per-channel ``scale`` (see
    :func:`zero_branch_scale`), in the branch's dtype; unchanged when
    ``scale`` is None."""
    if scale is None:
        return branch
    return branch * scale.to(branch.dtype).view(1, -1, 1, 1)


def drop_path_mask(x: Tensor, drop_path: float,
                   training: bool) -> Optional[Tensor]:
    """DropPath's per-sample multiplier of the branch, (N, 1, 1, 1): 0 or
    1 / (1 - drop_path); None when nothing is dropped."""
    if training and drop_path > 0:
        keep = 1 - drop_path
        mask = x.new_empty((x.shape[0], 1, 1, 1)).bernoulli_(keep)
        return mask.div_(keep)
    return None


def masked_residual_add(x: Tensor, branch: Tensor,
                        mask: Optional[Tensor]) -> Tensor:
    """x + mask * branch (x + branch for no mask), out of place."""
    return x + branch if mask is None else torch.addcmul(x, branch, mask)


def add_branch(x: Tensor, branch: Tensor, drop_path: float,
               training: bool) -> Tensor:
    """x + DropPath(branch), per sample, out of place."""
    return masked_residual_add(x, branch,
                               drop_path_mask(x, drop_path, training))


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
            out = torch.baddbmm(base.reshape(flat), scale_3d, t.reshape(flat))
        return out.view(t.shape)
    # Elementwise with one scale per channel: a (N, heads, -1) reshape would
    # copy a channels_last tensor, and bmm would be autocast to fp16 (these
    # ops promote to the scale's fp32 instead).
    scale_4d = scale.repeat_interleave(
        t.shape[1] // heads, dim=1)[..., None, None]
    if base is None:
        return t * scale_4d
    return torch.addcmul(base, t, scale_4d)


def is_frozen_bn(norm: nn.Module) -> bool:
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
