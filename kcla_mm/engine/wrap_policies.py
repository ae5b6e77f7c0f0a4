# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""FSDP wrap policies for layer-attention ResNets, registered in mmengine's
FUNCTIONS so that a FlexibleRunner config names them:
``strategy=dict(type='FSDPStrategy', model_wrapper=dict(
auto_wrap_policy=dict(type='residual_block_wrap_policy')))``."""
from mmdet.models.backbones.resnet import BasicBlock, Bottleneck
from mmengine.registry import FUNCTIONS
from mmseg.models.backbones.resnet import BasicBlock as MMSegBasicBlock
from mmseg.models.backbones.resnet import Bottleneck as MMSegBottleneck
from torch import nn

#: mmdet's and mmseg's residual blocks; the layer-attention blocks
#: (:mod:`kcla_mm.models.layers.cross_layer_block`) are subclasses.
RESIDUAL_BLOCKS = (BasicBlock, Bottleneck, MMSegBasicBlock, MMSegBottleneck)


@FUNCTIONS.register_module()
def residual_block_wrap_policy(module: nn.Module, recurse: bool,
                               nonwrapped_numel: int) -> bool:
    """FSDP's auto-wrap policy (a callable, as ``ModuleWrapPolicy({
    BasicBlock, Bottleneck})`` is for torch users) that makes every
    residual block one FSDP unit. A KCLA, LA or MRLA-light block calls its
    attention layer in its own forward, so the layer's parameters are
    gathered with the block's."""
    return True if recurse else isinstance(module, RESIDUAL_BLOCKS)
