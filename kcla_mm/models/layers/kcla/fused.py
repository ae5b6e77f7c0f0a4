# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""The default implementation of :class:`~.KCLALayer`: the function of
:meth:`KCLALayer.forward_reference` with fewer passes over memory.

Each function here computes a piece of the reference and is tested against
it (tests/test_kcla_fused.py):

* :func:`fused_query_key`: Q and K in one conv1d of two output channels (at
  batch 1 an op on pooled vectors costs microseconds of dispatch, not of
  arithmetic);
* :func:`fused_renormalise`: Algorithm 1 with ``1 / Z`` in per-sample
  copies of the adapter's weights (:func:`.scaled_adapt`) and the final
  scaling as a batched outer product (:func:`head_scaled_add`), and in
  inference
  :func:`folded_renormalise`, one matmul with every scaling folded into the
  conv's weights;
* :func:`folded_value`: ``ReLU(Norm(gate * DWConv(U / (Z + eps))))`` with the
  per-head ``gate / (Z + eps)`` (and, for an eval-mode BN, its affine map)
  folded into the depthwise kernel, which is linear and per channel, so
  that the state is read once instead of three times;
* :func:`fused_forward`: the whole p.
"""
from typing import Callable, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ....torch_compat import is_autocast_enabled, is_exporting
from ..attention_branch import (adapt_state, adapt_strided, add_branch,
                                bn_affine, full_precision,
                                grouped_strided_input, head_scaled_add,
                                is_frozen_bn, is_plain_pointwise,
                                matmul_adapts, per_sample_weight, pooled_conv,
                                pooled_linear, scale_branch, spatial_mean)
from ..profiling import phase
from .norm_replay import applies_running_statistics
from .params import KCLAParams
from .state import STATE_EPS, KCLAState


def fused_query_key(p: KCLAParams,
                    x: Tensor,
                    means: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """:meth:`KCLALayer.query_key` in one conv1d, in the pooled vector's
    (at least fp32) dtype (see :func:`.pooled_conv`); from ``means``
    where given (``x``'s plane means, :func:`.spatial_mean`'s)."""
    pooled = (spatial_mean(x) if means is None else means)[:, None]
    weight = torch.cat([p.query_weight, p.key_weight])
    with full_precision(x.device.type):
        qk = F.conv1d(pooled, weight.to(pooled.dtype), padding=p.eca_padding)
    query, key = qk.view(-1, 2, p.num_heads, p.head_dim).unbind(1)
    return query, key


def fused_renormalise(
        p: KCLAParams,
        state: KCLAState,
        norm: Optional[Callable[[Tensor], Tensor]] = None) -> KCLAState:
    """:meth:`KCLALayer.renormalise` with fewer passes over the state:
    ``U / Z`` as weights of the adapter's matmul where it runs as one
    (:func:`.matmul_adapts`), else a batched outer product, as is the final
    ``A Z'``; ``norm`` replaces ``p.state_norm`` (see
    :func:`folded_value`)."""
    u, z = state.u, state.z
    if adapts_by_matmul(p, u):
        return renormalise_strided_input(
            p, *grouped_strided_input(p.state_adapt, u), z, norm)
    a = head_scaled_add(None, z.reciprocal(), u)
    return normalise_adapted(
        p, adapt_state(p.state_adapt, a.to(p.value_weight.dtype)), norm)


def adapts_by_matmul(p: KCLAParams, u: Tensor) -> bool:
    """Whether :func:`fused_renormalise` runs Algorithm 1's adapter on
    ``u`` as a batched matmul (:func:`.matmul_adapts`), reading only
    :func:`.grouped_strided_input` of it."""
    conv = p.state_adapt
    return (conv is not None and u.dtype == p.value_weight.dtype
            and matmul_adapts(conv, u))


def renormalise_strided_input(
        p: KCLAParams,
        sub: Tensor,
        size: Tuple[int, int],
        z: Tensor,
        norm: Optional[Callable[[Tensor], Tensor]] = None) -> KCLAState:
    """:func:`fused_renormalise` from what its adapter reads of ``U``
    (``sub`` and ``size`` of :func:`.grouped_strided_input`; a quarter
    of ``U`` at stride 2), where :func:`adapts_by_matmul`."""
    c_in = sub.shape[1] * sub.shape[2]
    a = adapt_strided(p.state_adapt, sub, size, channel_reciprocal(z, c_in))
    return normalise_adapted(p, a, norm)


def normalise_adapted(
        p: KCLAParams,
        a: Tensor,
        norm: Optional[Callable[[Tensor], Tensor]] = None) -> KCLAState:
    """The rest of Algorithm 1 after the adapter: ``Norm_s(A)``, its new
    weights ``Z'`` and ``U' = A Z'``."""
    a = (p.state_norm if norm is None else norm)(a)
    z = renormalised_weights(p, spatial_mean(a))
    return KCLAState(head_scaled_add(None, z, a), z)


def channel_reciprocal(z: Tensor, channels: int) -> Tensor:
    """(N, C): 1 / Z of the head of each of the state's ``channels``."""
    return z.reciprocal().repeat_interleave(channels // z.shape[1], dim=1)


def folds_renormalise(p: KCLAParams, state: KCLAState) -> bool:
    """Whether :func:`folded_renormalise` covers Algorithm 1 here: no
    autograd, an eval-mode BN, a plain 1x1 conv (or none), an NCHW state in
    the weights' dtype, no autocast and no tracing (FLOP counts and exports
    keep the paper's ops)."""
    conv = p.state_adapt
    return (not torch.is_grad_enabled() and not is_exporting()
            and is_frozen_bn(p.state_norm)
            and (conv is None or is_plain_pointwise(conv))
            and state.u.dtype == p.value_weight.dtype
            and state.u.is_contiguous()
            and not is_autocast_enabled(state.u.device.type))


def folded_renormalise(p: KCLAParams, state: KCLAState) -> KCLAState:
    """Algorithm 1 in inference (see :func:`folds_renormalise`) as one
    batched matmul over the state.

    ``U / Z``, the eval BN's affine map and the final ``A Z'`` are per
    (sample, channel) scalings around the head-grouped 1x1 conv, which is
    linear: they fold into per-sample conv weights. ``Z'`` comes from the
    spatial mean of ``A``, which is the same folded map applied to the mean
    of the conv's (strided) input, so it is known before ``A`` is computed.
    What is left is a strided read of ``U`` and one matmul, where
    :func:`fused_renormalise` makes five passes.
    """
    u, z = state.u, state.z
    n, c_in = u.shape[:2]
    in_scale = channel_reciprocal(z, c_in)
    bn_scale, bn_shift = bn_affine(p.state_norm)
    head_dim = p.head_dim
    conv = p.state_adapt

    if conv is None:  # re-normalisation within a stage: no conv
        scale = in_scale * bn_scale  # (N, C)
        mean = u.mean((2, 3)) * scale + bn_shift
        z_new = renormalised_weights(p, mean)
        out_scale = z_new.repeat_interleave(head_dim, dim=1)
        return KCLAState(
            torch.addcmul((bn_shift * out_scale)[..., None, None], u,
                          (scale * out_scale)[..., None, None]), z_new)

    groups = conv.groups
    c_out = conv.out_channels
    sub, (h, w) = grouped_strided_input(conv, u)
    weight = per_sample_weight(conv, in_scale) * bn_scale.view(
        1, groups, c_out // groups, 1)
    mean = (weight @ sub.mean(3, keepdim=True)).view(n, c_out) + bn_shift
    z_new = renormalised_weights(p, mean)
    out_scale = z_new.repeat_interleave(
        head_dim, dim=1).view(n, groups, c_out // groups, 1)
    out = torch.baddbmm(
        (bn_shift.view(1, groups, c_out // groups, 1) * out_scale).view(
            n * groups, c_out // groups, 1),
        (weight * out_scale).view(n * groups, c_out // groups, c_in // groups),
        sub.view(n * groups, c_in // groups, h * w))
    return KCLAState(out.view(n, c_out, h, w), z_new)


def renormalised_weights(p: KCLAParams, mean: Tensor) -> Tensor:
    """Algorithm 1's new per-head weights Z' from the spatial mean (N, C)
    of the adapted, normalised state."""
    key = pooled_conv(p.state_key_conv,
                      mean[:, None]).view(-1, p.num_heads, p.head_dim)
    return p.layer_weight(torch.linalg.vector_norm(key, dim=2))


def renormalise_in_forward(p: KCLAParams, state: KCLAState) -> KCLAState:
    """Algorithm 1 as a forward pass runs it: :func:`folded_renormalise`
    where it applies (inference), else :func:`fused_renormalise`."""
    if folds_renormalise(p, state):
        return folded_renormalise(p, state)
    return fused_renormalise(p, state)


def folded_value(p: KCLAParams,
                 u: Tensor,
                 scale: Tensor,
                 dtype: torch.dtype,
                 norm: Optional[Callable[[Tensor], Tensor]] = None) -> Tensor:
    """:meth:`KCLALayer.branch` with ``scale = gate / (Z + eps)``, of
    shape (N, heads), folded into the depthwise kernel (the gate commutes
    with the per-channel conv): ``ReLU(Norm(DWConv(U * scale)))``, reading
    U once where possible. ``norm`` replaces ``p.norm`` (the recomputing
    backward's :class:`.NormReplay`: the norm as the forward applied it).
    """
    norm = p.norm if norm is None else norm
    n, c = u.shape[:2]
    # A channels_last batch cannot merge N and C into one channel axis
    # for the per-sample fold below.
    if (u.dtype != dtype or is_autocast_enabled(u.device.type)
            or (n > 1 and not u.is_contiguous())):
        # The raw state may exceed the fp16 range: scale it first (the
        # scaled state is a convex mix of the block outputs).
        v = head_scaled_add(None, scale, u).to(dtype)
        v = F.conv2d(v, p.value_weight, padding=1, groups=c)
        return F.relu(norm(v), inplace=True)

    # Per-sample, per-channel scale folded into a depthwise kernel of
    # N * C groups: (N, heads, head_dim, 3, 3).
    kernel = p.split_heads(p.value_weight.view(1, c, 3, 3))
    kernel = kernel * scale[..., None, None, None]
    bias = None
    fold_norm = applies_running_statistics(norm)
    if fold_norm:
        # Eval-mode BN is a per-channel affine map: fold it in too.
        bn_scale, bias = bn_affine(norm)
        kernel = kernel * p.split_heads(bn_scale.view(1, c, 1, 1))
        bias = bias.repeat(n) if n > 1 else bias
    v = F.conv2d(
        # At n = 1 the view would give a channels_last u an ambiguous
        # batch stride, and the conv would copy it to NCHW.
        u if n == 1 else u.view(1, n * c, *u.shape[2:]),
        kernel.reshape(n * c, 1, 3, 3),
        bias,
        padding=1,
        groups=n * c)
    if fold_norm:
        # In place on the conv's own output, not on a view of it: an
        # in-place op on a view makes autograd copy the whole tensor
        # back (CopySlices) and hand the conv a strided gradient.
        return F.relu(v, inplace=True).view_as(u)
    return F.relu(norm(v.view_as(u)), inplace=True)


def gate_and_weight(p: KCLAParams, query: Tensor,
                    key: Tensor) -> Tuple[Tensor, Tensor]:
    """:meth:`KCLALayer.gate` and :meth:`KCLALayer.layer_weight` of one
    block, each (N, heads), sharing ||K||."""
    k_norm = torch.linalg.vector_norm(key, dim=2)
    w = p.layer_weight(k_norm)
    # ||Q|| cos(theta) = <Q, K> / ||K||, with the norm computed once.
    # (Q * K).sum, not linalg.vecdot: bit-identical (ATen computes vecdot
    # so), and the ONNX exporters have no symbolic for vecdot.
    q_cos = (query * key).sum(2) / k_norm.clamp_min(1e-12)
    gate = torch.sigmoid(pooled_linear(q_cos, p.head_mix))
    return gate, w


def fused_forward(p: KCLAParams, x: Tensor,
                  state: Optional[KCLAState]) -> Tuple[Tensor, KCLAState]:
    """:meth:`KCLALayer.forward_reference`, fused."""
    if state is not None and p.renorm:
        with phase('renormalise'):
            state = renormalise_in_forward(p, state)
    with phase('pooled'):
        gate, w = gate_and_weight(p, *fused_query_key(p, x))
    with phase('state_update'):
        if state is None:
            u, z = head_scaled_add(None, w, x), w
        else:
            u, z = head_scaled_add(state.u, w, x), state.z + w
    with phase('branch'):
        out = scale_branch(
            folded_value(p, u, gate / (z + STATE_EPS), x.dtype),
            p.branch_scale)
    with phase('residual'):
        x = add_branch(x, out, p.drop_path, p.training)
    return x, KCLAState(u, z)
