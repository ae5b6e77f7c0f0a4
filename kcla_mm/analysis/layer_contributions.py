# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""How much each earlier block contributes to the aggregate at block t.

Both functions run one eval forward and return, for every block t (in
network order), an array of shape (heads_t, t + 1): the share of blocks
0..t in what block t's attention reads, averaged over the batch. Each row
sums to 1.

Heads: the stage widths double while head_dim stays, so a stage has twice
the previous stage's heads. The state adaptation is a conv grouped by the
new heads, so new head h reads old head h * heads_old // heads_new; a block
before a stage boundary is followed through that lineage.
"""
from typing import List

import torch
import torch.nn as nn
from torch import Tensor
from torch.nn.modules.batchnorm import _BatchNorm

from kcla_mm.models.layers import KCLALayer, MRLALightLayer
from kcla_mm.models.layers.attention_branch import bn_affine
from .complexity import attention_modules, eval_forward_with_hooks


def _lineage(coef: Tensor, heads: int) -> Tensor:
    """(N, heads_old, T) -> (N, heads, T) along the adaptation's groups."""
    old = coef.shape[1]
    return coef[:, torch.arange(heads) * old // heads]


def kcla_normalised_weights(model: nn.Module, x: Tensor) -> List[Tensor]:
    """w_i / Z_t of every block i <= t at block t, per head, for a
    KCLAResNet.

    KCLA's state is U^t = sum_i w_i X_i, Z^t = sum_i w_i, so block i enters
    the aggregate U^t / Z^t with weight w_i / Z_t. Where a layer
    re-normalises (Algorithm 1: A = U / Z mapped, then U = A z'), the
    earlier blocks keep their shares of A, scaled by z' / Z_t.
    """
    records = []

    def before(module: KCLALayer, args):
        x_t, state = args
        _, key = module.query_key(x_t)
        renorm_z = None
        if state is not None and module.renorm:
            renorm_z = module.renormalise(state).z
        records.append(
            dict(w=module.layer_weight(key.norm(dim=2)), renorm_z=renorm_z))

    def after(module, args, out):
        records[-1]['z'] = out[1].z

    handles = []
    for _, module in attention_modules(model):
        if not isinstance(module, KCLALayer):
            raise TypeError(f'{type(model).__name__} is not a KCLA backbone')
        handles += [
            module.register_forward_pre_hook(before),
            module.register_forward_hook(after)
        ]
    eval_forward_with_hooks(model, x, handles)

    rows, coef, z = [], None, None
    for rec in records:
        w = rec['w'].double()
        if coef is None:
            coef, z = w[..., None], w
        else:
            if rec['renorm_z'] is not None:
                r = rec['renorm_z'].double()
                coef = _lineage(coef / z[..., None], r.shape[1]) * r[..., None]
                z = r
            coef = torch.cat([coef, w[..., None]], dim=2)
            z = z + w
        # The recursion must reproduce the layer's own normaliser.
        torch.testing.assert_close(z, rec['z'].double(), rtol=1e-4, atol=0)
        rows.append((coef / z[..., None]).mean(0).float())
    return rows


def _linear_part(norm: nn.Module, t: Tensor) -> Tensor:
    """The eval-mode BN's per-channel scale applied to t (its shift is not
    any block's contribution)."""
    if not isinstance(norm, _BatchNorm) or norm.training:
        raise TypeError('MRLA-light contributions need eval-mode BN state '
                        f'norms, got {type(norm).__name__}')
    scale, _ = bn_affine(norm)
    return t * scale.view(1, -1, 1, 1)


def mrla_light_shares(model: nn.Module, x: Tensor) -> List[Tensor]:
    """Share of block i in ||O^t|| per head, for an MRLALightResNet.

    Unrolled, O^t = sum_i C_{t,i} with C_{t,t} = gate_t V^t and
    C_{t,i} = lambda^t * C_{t-1,i}: block i enters with the effective
    coefficient gate_i * prod_{j=i+1..t} lambda^j (the KCLA paper's decay
    coefficients). At a stage boundary C is carried through the adaptation
    conv and the linear part of its norm. The share is
    ||C_{t,i}||_head / sum_j ||C_{t,j}||_head.
    """
    rows, terms = [], []

    def before(module: MRLALightLayer, args):
        x_t, state = args
        carried = []
        for term in terms:
            if module.state_adapt is not None:
                term = _linear_part(module.state_norm,
                                    module.state_adapt(term))
            carried.append(term * module.decay.view(1, -1, 1, 1))
        own = module.gate(x_t).repeat_interleave(module.head_dim, 1)
        carried.append(own[..., None, None] * module.value_conv(x_t))
        terms[:] = carried
        n, heads = x_t.shape[0], module.num_heads
        norms = torch.stack(
            [t.double().reshape(n, heads, -1).norm(dim=2) for t in terms],
            dim=2)
        rows.append((norms / norms.sum(2, keepdim=True)).mean(0).float())

    handles = []
    for _, module in attention_modules(model):
        if not isinstance(module, MRLALightLayer):
            raise TypeError(f'{type(model).__name__} is not an MRLA-light '
                            'backbone')
        handles.append(module.register_forward_pre_hook(before))
    eval_forward_with_hooks(model, x, handles)
    return rows
