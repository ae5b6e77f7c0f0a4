# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""A residual block and the KCLA layer after it, in inference, with the
block's last norm, residual add and ReLU fused into the compiled kernels.

The block ends in ``ReLU(Norm(conv(.)) + identity)``: three passes over
memory in eager PyTorch (the ReLU and the add in place), and the KCLA layer
then reads the result once more for its pooled vectors and again for its
branch. :func:`fused_block_and_kcla` runs the block's own modules up to its
last conv, then one kernel for the norm (running statistics), the add, the
ReLU and the plane means, written over that conv's output where nothing
else can hold it (a plain ``nn.Conv2d`` without hooks), and writes the
layer's output over that fresh block output, which nothing else holds.

It applies only where nothing could tell the difference: no autograd, a
block and layer in eval mode, one of mmdet's or mmseg's plain ``BasicBlock``
/ ``Bottleneck`` classes or their cross-layer versions exactly (any other
subclass may change ``forward``),
without plugins, a BatchNorm with running statistics at its end, no hooks
on the block, its last norm, its ReLU or the layer (nor global module
hooks: they would not see the skipped calls), the layer not wrapped
(:func:`calls_layer_directly`), and the layer's compiled
kernels applicable (:func:`.compiled_applies`). Everything else runs
``block`` and ``layer`` as modules. The backbone reaches it through
:meth:`KCLALayer.forward_with_block`, without knowing KCLA. Tested against
that in tests/test_fused_block_tail.py.
"""
from typing import TYPE_CHECKING, Optional, Tuple

import torch
import torch.nn as nn
from mmdet.models.backbones.resnet import BasicBlock, Bottleneck
from mmseg.models.backbones.resnet import BasicBlock as MMSegBasicBlock
from mmseg.models.backbones.resnet import Bottleneck as MMSegBottleneck
from torch import Tensor
from torch.nn.modules import module as module_hooks
from torch.nn.modules.batchnorm import _BatchNorm

from ..cross_layer_block import CROSS_LAYER_BLOCKS
from .compiled import compiled_applies, compiled_forward, extension
from .params import KCLAParams
from .state import KCLAState

if TYPE_CHECKING:  # pragma: no cover
    from .layer import KCLALayer

BASIC_BLOCKS = (BasicBlock, MMSegBasicBlock)
BOTTLENECKS = (Bottleneck, MMSegBottleneck)
# Classes whose block body is exactly mmdet's or mmseg's.
KNOWN_BLOCKS = frozenset(BASIC_BLOCKS + BOTTLENECKS +
                         tuple(CROSS_LAYER_BLOCKS.values()))


def has_hooks(module: nn.Module) -> bool:
    """Whether ``module`` has forward (pre-)hooks of its own.

    torch has no public call that answers this, so it reads the module's
    hook dictionaries (and :func:`tail_fuses` torch's global ones);
    tests/test_fused_block_tail.py pins on both supported torch versions
    that every kind of forward hook turns the fusion off."""
    return bool(module._forward_hooks or module._forward_pre_hooks)


def calls_layer_directly(block: nn.Module, layer: nn.Module) -> bool:
    """Whether ``layer`` may run without being called as a module: the
    block's attention child, where it has one, is the layer itself, not a
    wrapper around it (FSDP's per layer unshards the layer's parameters
    only in its own forward; a checkpoint wrapper's would not run)."""
    child = getattr(block, getattr(block, 'attention_name', ''), None)
    return child is None or child is layer


def plain_conv(conv: nn.Module) -> bool:
    """Whether ``conv`` is a plain ``nn.Conv2d`` without hooks: its forward
    is ``F.conv2d`` (as :class:`.RecomputedInputConv` computes it), whose
    output is a new tensor that nothing else has seen."""
    return (type(conv) is nn.Conv2d and conv.padding_mode == 'zeros'
            and not isinstance(conv.padding, str) and not has_hooks(conv))


def tail_norm(block: nn.Module) -> nn.Module:
    """The norm before the block's residual add."""
    return block.norm3 if isinstance(block, BOTTLENECKS) else block.norm2


def tail_fuses(block: nn.Module,
               layer: 'KCLALayer',
               x: Tensor,
               state: Optional[KCLAState],
               params: Optional[KCLAParams] = None) -> bool:
    """Whether :func:`fused_block_and_kcla` applies (module docstring);
    ``params``, where given, are ``layer.params()``."""
    if (torch.is_grad_enabled() or type(block) not in KNOWN_BLOCKS):
        return False
    norm = tail_norm(block)
    return (not block.training and not layer.training
            and calls_layer_directly(block, layer)
            and not getattr(block, 'with_plugins', False)
            and isinstance(norm, _BatchNorm) and not norm.training
            and norm.running_mean is not None
            and norm.running_mean.dtype == x.dtype
            and layer.implementation in ('auto', 'compiled')
            and not any(map(has_hooks, (block, norm, block.relu, layer)))
            and not module_hooks._global_forward_hooks
            and not module_hooks._global_forward_pre_hooks
            and compiled_applies(layer.params() if params is None else params,
                                 x, state))


def fused_block_and_kcla(
        block: nn.Module, layer: 'KCLALayer', x: Tensor,
        state: Optional[KCLAState]) -> Optional[Tuple[Tensor, KCLAState]]:
    """``layer(block(x), state)`` with the block's tail fused into the
    kernels where :func:`tail_fuses`; None (nothing run) elsewhere."""
    if torch.is_grad_enabled():
        # tail_fuses' first check: no need to build params to hear it.
        return None
    # Built once: at batch 1 the walk over the layer's modules costs as
    # much as a small plane's kernels.
    params = layer.params()
    if not tail_fuses(block, layer, x, state, params):
        return None
    # The block's forward (mmdet's and mmseg's alike) up to its last conv.
    out = block.relu(block.norm1(block.conv1(x)))
    if isinstance(block, BOTTLENECKS):
        out = block.relu(block.norm2(block.conv2(out)))
        conv = block.conv3
    else:
        conv = block.conv2
    pre = conv(out)
    identity = x if block.downsample is None else block.downsample(x)
    norm = tail_norm(block)
    # The block's output is written over its last conv's where nothing else
    # can hold that: at detection sizes each stage-1 tensor is a fresh
    # mmap of some 60 MB, whose pages fault in again at every forward.
    block_out, means = extension().block_tail_forward(
        pre.contiguous(), identity.contiguous(), norm.weight, norm.bias,
        norm.running_mean, norm.running_var, norm.eps, plain_conv(conv))
    return compiled_forward(
        params, block_out, state, means=means, overwrite_x=True)
