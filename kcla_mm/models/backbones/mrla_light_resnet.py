# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
from typing import Optional

from ...registry import register_backbone
from ..layers import MRLALightLayer
from .arguments import check_rate
from .cross_layer_resnet import CrossLayerResNet


class MRLALightResNetMixin:
    """What makes a layer-attention ResNet MRLA-light: its arguments and its
    :class:`MRLALightLayer` after every block. Put it before a
    :class:`~.cross_layer_resnet.CrossLayerResNetMixin` class in the bases
    (:class:`MRLALightResNet`, and mmseg's ``MRLALightResNet`` in
    :mod:`.mmseg_resnet`); the arguments are :class:`MRLALightResNet`'s."""
    attention_name = 'mrla_light'

    def __init__(self,
                 depth: int,
                 head_dim: int = 32,
                 mrla_light_drop_path: float = 0.2,
                 **kwargs):
        check_rate('mrla_light_drop_path', mrla_light_drop_path)
        self.mrla_light_cfg = self.shared_layer_cfg(
            kwargs, head_dim=head_dim, drop_path=mrla_light_drop_path)
        super().__init__(depth=depth, head_dim=head_dim, **kwargs)

    def make_attention(self, channels: int, block_index: int,
                       state_channels: Optional[int],
                       state_stride: int) -> MRLALightLayer:
        return MRLALightLayer(
            channels,
            state_channels=state_channels,
            state_stride=state_stride,
            # The network's very first block has no O^{t-1}.
            receives_state=state_channels is not None,
            **self.mrla_light_cfg)


# 'MRLALResNet': the name kcla_mm 0.1.0 registered; kept so that configs
# written for it still build. mmseg's registry has its own MRLALightResNet,
# over mmseg's ResNet (.mmseg_resnet).
@register_backbone(
    name=['MRLALightResNet', 'MRLALResNet'],
    registries=('mmdet', 'mmpretrain'))
class MRLALightResNet(MRLALightResNetMixin, CrossLayerResNet):
    """ResNet with MRLA-light (Fang et al., ICLR 2023), the linear baseline.

    A :class:`~kcla_mm.models.layers.MRLALightLayer` follows every block
    (at ``layerN.J.mrla_light``) and carries the previous block's attention
    output O^{t-1}, scaled by a learnable per-channel decay ``decay``
    (lambda^t): block i reaches block t with coefficient
    gate_i * prod_{j=i+1..t} lambda^j. Every option of mmdet's ResNet keeps
    its meaning; plain ResNet weights load into the ResNet part.

    Args:
        head_dim (int): Channels per head. Default: 32 (official MRLA).
        mrla_light_drop_path (float): Drop-path rate of the attention
            branch, in [0, 1).
            Default: 0.2 (official MRLA ImageNet training).
        zero_init_attention (bool): Start every attention branch at zero
            (warm start from plain ResNet weights), see
            :class:`CrossLayerResNetMixin`. Default: False.
        **kwargs: Arguments of mmdet's ``ResNet`` (depth, in_channels,
            base_channels, num_stages, strides, dilations, out_indices, style,
            deep_stem, avg_down, frozen_stages, conv_cfg, norm_cfg, norm_eval,
            with_cp, zero_init_residual, plugins, init_cfg, ...).
    """
