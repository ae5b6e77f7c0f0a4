# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""The default implementation of :class:`~.KCLALayer`: the function of
:meth:`KCLALayer.forward_reference` with fewer passes over memory.

Each function here computes a piece of the reference and is tested against
it (tests/test_kcla_fused.py):

* :func:`fused_query_key`: Q and K in one conv1d of two output channels (at
  batch 1 an op on pooled vectors costs microseconds of dispatch, not of
  arithmetic);
* :func:`fused_renormalise`: Algorithm 1 with the per-head scalings as
  batched outer products (:func:`head_scaled_add`);
* :func:`folded_value`: ``ReLU(Norm(gate * DWConv(U / (Z + eps))))`` with the
  per-head ``gate / (Z + eps)`` (and, for an eval-mode BN, its affine map)
  folded into the depthwise kernel, which is linear and per channel, so
  that the state is read once instead of three times;
* :func:`fused_forward`: the whole layer, optionally updating the block
  output and the state in place in inference.
"""
from typing import TYPE_CHECKING, Callable, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ...torch_compat import is_autocast_enabled
from .attention_branch import (add_branch, at_least_fp32, bn_affine,
                               head_scaled_add, is_frozen_bn, scale_branch,
                               spatial_mean)
from .kcla_state import STATE_EPS, KCLAState

if TYPE_CHECKING:  # pragma: no cover
    from .kcla_layer import KCLALayer


def fused_query_key(layer: 'KCLALayer', x: Tensor) -> Tuple[Tensor, Tensor]:
    """:meth:`KCLALayer.query_key` in one conv1d."""
    qk = F.conv1d(
        spatial_mean(x)[:, None],
        torch.cat([layer.query_conv.weight, layer.key_conv.weight]),
        padding=layer.query_conv.padding)
    query, key = at_least_fp32(qk).view(-1, 2, layer.num_heads,
                                        layer.head_dim).unbind(1)
    return query, key


def fused_renormalise(
        layer: 'KCLALayer',
        state: KCLAState,
        norm: Optional[Callable[[Tensor], Tensor]] = None) -> KCLAState:
    """:meth:`KCLALayer.renormalise` with batched per-head scalings;
    ``norm`` replaces ``layer.state_norm`` (see :func:`folded_value`)."""
    a = head_scaled_add(None, state.z.reciprocal(), state.u)
    a = a.to(layer.value_conv.weight.dtype)
    if layer.state_adapt is not None:
        a = layer.state_adapt(a)
    a = (layer.state_norm if norm is None else norm)(a)
    key = at_least_fp32(layer.state_key_conv(spatial_mean(a)[:, None])).view(
        -1, layer.num_heads, layer.head_dim)
    z = layer.layer_weight(torch.linalg.vector_norm(key, dim=2))
    return KCLAState(head_scaled_add(None, z, a), z)


def folded_value(layer: 'KCLALayer',
                 u: Tensor,
                 scale: Tensor,
                 dtype: torch.dtype,
                 norm: Optional[Callable[[Tensor], Tensor]] = None) -> Tensor:
    """:meth:`KCLALayer.branch` with ``scale = gate / (Z + eps)``, of
    shape (N, heads), folded into the depthwise kernel (the gate commutes
    with the per-channel conv): ``ReLU(Norm(DWConv(U * scale)))``, reading
    U once where possible. ``norm`` replaces ``layer.norm`` where it is
    applied as a module (the recomputing backward replays it without
    updating running statistics).
    """
    norm = layer.norm if norm is None else norm
    n, c = u.shape[:2]
    # A channels_last batch cannot merge N and C into one channel axis
    # for the per-sample fold below.
    if (u.dtype != dtype or is_autocast_enabled(u.device.type)
            or (n > 1 and not u.is_contiguous())):
        # The raw state may exceed the fp16 range: scale it first (the
        # scaled state is a convex mix of the block outputs).
        v = head_scaled_add(None, scale, u).to(dtype)
        return F.relu(norm(layer.value_conv(v)), inplace=True)

    # Per-sample, per-channel scale folded into a depthwise kernel of
    # N * C groups: (N, heads, head_dim, 3, 3).
    kernel = layer.split_heads(layer.value_conv.weight.view(1, c, 3, 3))
    kernel = kernel * scale[..., None, None, None]
    bias = None
    fold_norm = is_frozen_bn(layer.norm)
    if fold_norm:
        # Eval-mode BN is a per-channel affine map: fold it in too.
        bn_scale, bias = bn_affine(layer.norm)
        kernel = kernel * layer.split_heads(bn_scale.view(1, c, 1, 1))
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


def gate_and_weight(layer: 'KCLALayer', query: Tensor,
                    key: Tensor) -> Tuple[Tensor, Tensor]:
    """:meth:`KCLALayer.gate` and :meth:`KCLALayer.layer_weight` of one
    block, each (N, heads), sharing ||K||."""
    k_norm = torch.linalg.vector_norm(key, dim=2)
    w = layer.layer_weight(k_norm)
    # ||Q|| cos(theta) = <Q, K> / ||K||, with the norm computed once.
    q_cos = torch.linalg.vecdot(query, key) / k_norm.clamp_min(1e-12)
    gate = torch.sigmoid(
        at_least_fp32(
            F.linear(
                q_cos.to(layer.head_mix.weight.dtype), layer.head_mix.weight)))
    return gate, w


def fused_forward(layer: 'KCLALayer',
                  x: Tensor,
                  state: Optional[KCLAState],
                  inplace: bool = False) -> Tuple[Tensor, KCLAState]:
    """:meth:`KCLALayer.forward_reference`, fused.

    With ``inplace`` and without autograd, ``x`` and ``state.u`` are
    updated in place (see ``KCLALayer``'s ``inplace`` argument).
    """
    if state is not None and layer.renorm:
        state = fused_renormalise(layer, state)
    gate, w = gate_and_weight(layer, *fused_query_key(layer, x))

    in_place = inplace and not torch.is_grad_enabled()
    if state is None:
        u, z = head_scaled_add(None, w, x), w
    elif in_place:
        u, z = state.u, state.z + w
        layer.split_heads(u).addcmul_(
            layer.split_heads(x), w[..., None, None, None])
    else:
        u, z = head_scaled_add(state.u, w, x), state.z + w
    out = scale_branch(
        folded_value(layer, u, gate / (z + STATE_EPS), x.dtype),
        layer.branch_scale)
    if in_place and not (layer.training and layer.drop_path > 0):
        x = x.add_(out)
    else:
        x = add_branch(x, out, layer.drop_path, layer.training)
    return x, KCLAState(u, z)
