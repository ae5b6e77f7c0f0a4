# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Residual blocks that run their layer-attention module in their own
forward: ``block(x, state) -> (x, state)``.

A layer-attention ResNet puts one module after every residual block and
threads a state through them. Run by the stage after ``block(x)``, that
module would sit outside every call of the block: a wrapper that shards a
module's parameters between its calls (FSDP per residual block, the usual
policy for ResNets: ``ModuleWrapPolicy({BasicBlock, Bottleneck})`` or
``fully_shard`` per block) would have resharded the attention module's
parameters, a child of the block, by the time the stage calls it. So the
block calls it: each class here is mmdet's or mmseg's ``BasicBlock`` /
``Bottleneck`` (a subclass, so ``isinstance`` policies and
``zero_init_residual`` still find it, with the same state-dict keys) whose
forward also takes and returns the state.
"""
from typing import Dict, Optional, Tuple

import torch.nn as nn
import torch.utils.checkpoint as cp
from mmdet.models.backbones.resnet import BasicBlock, Bottleneck
from mmseg.models.backbones.resnet import BasicBlock as MMSegBasicBlock
from mmseg.models.backbones.resnet import Bottleneck as MMSegBottleneck
from torch import Tensor


def recomputes_backward(attention: nn.Module, x: Tensor, state) -> bool:
    """Whether ``attention(x, state)`` recomputes its own backward, as a
    module says through an optional ``recomputes_backward(x, state)``
    method: such a call keeps little already, and its nodes read each
    other's saved tensors, which a checkpoint would allow to be unpacked
    only once; ``with_cp`` then leaves it out of the block's checkpoint."""
    asks = getattr(attention, 'recomputes_backward', None)
    return asks is not None and asks(x, state)


class CrossLayerBlockMixin:
    """A residual block followed by its layer-attention module, in one call.

    Put it before a block class in the bases. The stage sets the module as
    the block's child named ``attention_name`` (see
    :class:`~kcla_mm.models.backbones.cross_layer_resnet.
    CrossLayerResLayerMixin`). A module that has a method
    ``forward_with_block(block, x, state)`` is first asked to run the
    block and itself in one go: it returns ``(x, state)``, or None (having
    run nothing) to have them run one after the other. With ``with_cp``
    the block checkpoints its own body, as its class does, and the module
    is checkpointed separately unless it recomputes its own backward
    (:func:`recomputes_backward`).
    """
    attention_name: str = 'attention'

    def forward_block(self, x: Tensor) -> Tensor:
        """The residual block alone, as its plain class computes it."""
        return super().forward(x)

    def forward(self, x: Tensor, state=None) -> Tuple[Tensor, object]:
        """Returns the block output after the attention module and the
        new state; ``state`` is None at the network's first block."""
        attention = getattr(self, self.attention_name)
        forward_with_block = getattr(attention, 'forward_with_block', None)
        if forward_with_block is not None:
            fused = forward_with_block(self, x, state)
            if fused is not None:
                return fused
        x = self.forward_block(x)
        if (self.with_cp and x.requires_grad
                and not recomputes_backward(attention, x, state)):
            return cp.checkpoint(attention, x, state, use_reentrant=False)
        return attention(x, state)


class CrossLayerBasicBlock(CrossLayerBlockMixin, BasicBlock):
    """mmdet's ``BasicBlock`` with its attention module (see
    :class:`CrossLayerBlockMixin`)."""


class CrossLayerBottleneck(CrossLayerBlockMixin, Bottleneck):
    """mmdet's ``Bottleneck`` with its attention module (see
    :class:`CrossLayerBlockMixin`)."""


class MMSegCrossLayerBasicBlock(CrossLayerBlockMixin, MMSegBasicBlock):
    """mmseg's ``BasicBlock`` with its attention module (see
    :class:`CrossLayerBlockMixin`)."""


class MMSegCrossLayerBottleneck(CrossLayerBlockMixin, MMSegBottleneck):
    """mmseg's ``Bottleneck`` with its attention module (see
    :class:`CrossLayerBlockMixin`)."""


#: plain block class -> its cross-layer subclass.
CROSS_LAYER_BLOCKS: Dict[type, type] = {
    BasicBlock: CrossLayerBasicBlock,
    Bottleneck: CrossLayerBottleneck,
    MMSegBasicBlock: MMSegCrossLayerBasicBlock,
    MMSegBottleneck: MMSegCrossLayerBottleneck,
}


def cross_layer_block(block: type) -> type:
    """The cross-layer subclass of the block class ``block``.

    Raises:
        TypeError: ``block`` is none of mmdet's and mmseg's ``BasicBlock``
            and ``Bottleneck`` (a custom ``arch_settings`` block).
    """
    found: Optional[type] = CROSS_LAYER_BLOCKS.get(block)
    if found is None:
        if block in CROSS_LAYER_BLOCKS.values():
            return block
        names = ', '.join(f'{b.__module__}.{b.__name__}'
                          for b in CROSS_LAYER_BLOCKS)
        raise TypeError(
            f'block {block.__module__}.{block.__name__} of arch_settings '
            'has no layer-attention version: a layer-attention ResNet '
            f'builds its stages from one of {names}')
    return found
