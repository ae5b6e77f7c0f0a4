# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Cosine similarity of the keys across layers in standard layer attention.

The KCLA paper's founding observation: in LA the keys of different layers
point in nearly the same direction, so a key norm can stand in for the
query-key product.
"""
from typing import List

import torch.nn as nn
from torch import Tensor

from kcla_mm.models.layers import LALayer
from .complexity import attention_modules, eval_forward_with_hooks


def la_key_similarity(model: nn.Module, x: Tensor) -> List[Tensor]:
    """Per stage, the (T, T) cosine similarity of the T cached keys at the
    stage's last block, per head then averaged over heads and the batch.

    The cache at the end of stage s holds the keys of all blocks so far in
    stage s's key space (earlier stages' keys recomputed from their adapted
    outputs), i.e. exactly the keys that block's softmax compares.
    """
    modules = list(attention_modules(model))
    if not modules or not all(isinstance(m, LALayer) for _, m in modules):
        raise TypeError(f'{type(model).__name__} is not an LA backbone')
    last_of_stage = {}
    for name, module in modules:
        last_of_stage[name.split('.')[0]] = module
    caches = []
    handles = [
        module.register_forward_hook(lambda m, args, out: caches.append(
            (m, out[1].keys))) for module in last_of_stage.values()
    ]
    eval_forward_with_hooks(model, x, handles)
    matrices = []
    for module, keys in caches:
        n, t, _ = keys.shape
        heads = nn.functional.normalize(
            keys.double().view(n, t, module.num_heads, module.head_dim),
            dim=3).transpose(1, 2)
        matrices.append((heads @ heads.transpose(2, 3)).mean((0, 1)).float())
    return matrices


def mean_off_diagonal(matrix: Tensor) -> float:
    t = matrix.shape[0]
    if t < 2:
        return float('nan')
    return float((matrix.sum() - matrix.diagonal().sum()) / (t * t - t))
