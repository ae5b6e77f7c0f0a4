# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
from typing import Optional

from ...registry import register_backbone
from ..layers import LALayer
from .arguments import check_rate
from .cross_layer_resnet import CrossLayerResNet


class LAResNetMixin:
    """What makes a layer-attention ResNet LA: its arguments and its
    :class:`LALayer` after every block. Put it before a
    :class:`~.cross_layer_resnet.CrossLayerResNetMixin` class in the bases
    (:class:`LAResNet`, and mmseg's ``LAResNet`` in :mod:`.mmseg_resnet`);
    the arguments are :class:`LAResNet`'s."""
    attention_name = 'la'

    def __init__(self,
                 depth: int,
                 head_dim: int = 64,
                 la_drop_path: float = 0.2,
                 **kwargs):
        check_rate('la_drop_path', la_drop_path)
        self.la_cfg = self.shared_layer_cfg(
            kwargs, head_dim=head_dim, drop_path=la_drop_path)
        super().__init__(depth=depth, head_dim=head_dim, **kwargs)

    def make_attention(self, channels: int, block_index: int,
                       state_channels: Optional[int],
                       state_stride: int) -> LALayer:
        return LALayer(
            channels,
            state_channels=state_channels,
            state_stride=state_stride,
            **self.la_cfg)


# mmseg's registry has its own LAResNet, over mmseg's ResNet
# (.mmseg_resnet).
@register_backbone(registries=('mmdet', 'mmpretrain'))
class LAResNet(LAResNetMixin, CrossLayerResNet):
    """ResNet with standard (full) layer attention, the quadratic baseline.

    Every block attends, with a softmax over the layers per head, to itself
    and to all earlier blocks of the network, whose keys and outputs are
    cached (:class:`~kcla_mm.models.layers.LALayer`, at ``layerN.J.la``);
    the cache is mapped to each new stage like KCLA's state. Memory grows
    linearly and compute quadratically with depth. Every option of mmdet's
    ResNet keeps its meaning; plain ResNet weights load into the ResNet
    part.

    Args:
        head_dim (int): Channels per head. Default: 64 (as KCLA).
        la_drop_path (float): Drop-path rate of the attention branch, in
            [0, 1).
            Default: 0.2 (as KCLA).
        zero_init_attention (bool): Start every attention branch at zero
            (warm start from plain ResNet weights), see
            :class:`CrossLayerResNetMixin`. Default: False.
        **kwargs: Arguments of mmdet's ``ResNet`` (depth, in_channels,
            base_channels, num_stages, strides, dilations, out_indices, style,
            deep_stem, avg_down, frozen_stages, conv_cfg, norm_cfg, norm_eval,
            with_cp, zero_init_residual, plugins, init_cfg, ...).
    """
