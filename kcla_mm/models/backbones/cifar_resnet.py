# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""The CIFAR ResNets of He et al. (2016), with and without layer attention.

Depth 6n+2 with BasicBlock or 9n+2 with Bottleneck: a 3x3 stem of 16
channels without max-pool, then three stages of n blocks with planes
16/32/64 and strides 1/2/2. This is the layout of the official KCLA CIFAR
code (github bgx666/KCLA, ``cifar/models/cifar/KCLA.py``, e.g.
``ResNet(depth=56, block_name='Bottleneck')``). mmpretrain's
``ResNet_CIFAR`` is another network: ImageNet depths and widths with a 3x3
stem.

Each class here is its ImageNet counterpart (mmdet's ``ResNet``,
:class:`KCLAResNet`, :class:`LAResNet`, :class:`MRLALightResNet`) with
:class:`CIFARLayoutMixin` in front: the same blocks, attention layers and
state handling, with the CIFAR stem and stage layout.
"""
from typing import Dict, Sequence, Tuple, Type

import torch.nn as nn
from mmcv.cnn import build_conv_layer, build_norm_layer
from mmdet.models.backbones import ResNet
from mmdet.models.backbones.resnet import BasicBlock, Bottleneck

from ...registry import register_backbone
from .arguments import check_resnet_args, is_int
from .cross_layer_resnet import CrossLayerResNetMixin
from .kcla_resnet import KCLAResNet
from .la_resnet import LAResNet
from .mrla_light_resnet import MRLALightResNet

CIFAR_BLOCKS: Dict[str, Tuple[Type[nn.Module], int]] = {
    # block name -> (block, layers per block); depth = layers * n + 2
    'BasicBlock': (BasicBlock, 6),
    'Bottleneck': (Bottleneck, 9),
}


def cifar_stage_blocks(depth: int, block: str) -> Tuple[int, int, int]:
    """Blocks per stage of the CIFAR ResNet of ``depth`` built from
    ``block``: (n, n, n)."""
    if block not in CIFAR_BLOCKS:
        raise ValueError(f'block={block!r} must be one of '
                         f'{sorted(CIFAR_BLOCKS)}')
    per_block = CIFAR_BLOCKS[block][1]
    fits = isinstance(depth, int) and depth >= per_block + 2
    if not fits or (depth - 2) % per_block:
        raise ValueError(
            f'depth={depth!r} does not fit block={block!r}: it must be '
            f'{per_block}n+2 with n >= 1 (e.g. {per_block * 6 + 2})')
    n = (depth - 2) // per_block
    return (n, n, n)


class CIFARLayoutMixin:
    """Puts a ResNet class into the CIFAR layout (see the module docstring).

    Put it before the ResNet class in the bases. The stage options keep
    mmdet's names and meanings with CIFAR defaults; mmdet's deep stem, which
    replaces the 7x7 stem, does not apply.

    Args:
        depth (int): 6n+2 with BasicBlock, 9n+2 with Bottleneck.
            Default: 56.
        block (str): ``'BasicBlock'`` or ``'Bottleneck'``.
            Default: 'Bottleneck' (the official KCLA CIFAR model).
        stem_channels (int): Width of the 3x3 stem. Default: 16.
        base_channels (int): Planes of the first stage. Default: 16.
        num_stages (int): Default: 3.
        strides (Sequence[int]): Default: (1, 2, 2).
        dilations (Sequence[int]): Default: (1, 1, 1).
        out_indices (Sequence[int]): Default: (2,), the last stage, which
            is what a classifier reads.
        norm_eval (bool): Default: False (a classifier trains its BN
            statistics; mmdet's ResNet defaults to True for detection).
        **kwargs: The other arguments of the ResNet class.
    """

    def __init__(self,
                 depth: int = 56,
                 block: str = 'Bottleneck',
                 stem_channels: int = 16,
                 base_channels: int = 16,
                 num_stages: int = 3,
                 strides: Sequence[int] = (1, 2, 2),
                 dilations: Sequence[int] = (1, 1, 1),
                 out_indices: Sequence[int] = (2, ),
                 norm_eval: bool = False,
                 **kwargs):
        if kwargs.get('deep_stem'):
            raise ValueError('deep_stem=True does not apply to the CIFAR '
                             'layout, whose stem is one 3x3 conv')
        if not is_int(num_stages) or not 1 <= num_stages <= 3:
            raise ValueError(f'num_stages={num_stages} must be in 1..3')
        # Per instance: mmdet's ResNet looks the depth up in
        # self.arch_settings, and 6n+2 / 9n+2 depend on the block.
        stage_blocks = cifar_stage_blocks(depth, block)
        self.arch_settings = {depth: (CIFAR_BLOCKS[block][0], stage_blocks)}
        self.block_name = block
        kwargs.update(
            stem_channels=stem_channels,
            base_channels=base_channels,
            num_stages=num_stages,
            strides=strides,
            dilations=dilations,
            out_indices=out_indices,
            norm_eval=norm_eval)
        if not isinstance(self, CrossLayerResNetMixin):
            # The layer-attention classes check these with their own.
            check_resnet_args(
                type(self).__name__, self.arch_settings, depth, kwargs)
        super().__init__(depth=depth, **kwargs)

    def train(self, mode: bool = True) -> nn.Module:
        # mmdet's ResNet.train() returns None; nn.Module's contract (and
        # `ResNetCIFAR().eval()`) expects the module back.
        super().train(mode)
        return self

    def _make_stem_layer(self, in_channels: int, stem_channels: int) -> None:
        # As mmdet's stem (conv1, bn1 keys), 3x3 stride 1 and no max-pool.
        self.conv1 = build_conv_layer(
            self.conv_cfg,
            in_channels,
            stem_channels,
            kernel_size=3,
            stride=1,
            padding=1,
            bias=False)
        self.norm1_name, norm1 = build_norm_layer(
            self.norm_cfg, stem_channels, postfix=1)
        self.add_module(self.norm1_name, norm1)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.Identity()


@register_backbone()
class ResNetCIFAR(CIFARLayoutMixin, ResNet):
    """The plain CIFAR ResNet (He et al., 2016): the baseline of
    :class:`KCLAResNetCIFAR`. Args: :class:`CIFARLayoutMixin` and mmdet's
    ``ResNet``."""


@register_backbone()
class KCLAResNetCIFAR(CIFARLayoutMixin, KCLAResNet):
    """KCLA-ResNet in the CIFAR layout: the official KCLA CIFAR model.

    ``KCLAResNetCIFAR(depth=56)`` is the backbone of the official
    ``ResNet(depth=56, block_name='Bottleneck', drop_path=0.2)``: head_dim
    16, KCLA drop path 0.2, re-normalisation in the first block of every
    stage but the first (whose first block has no state to carry).

    Args:
        head_dim (int): Channels per KCLA head. Default: 16 (official CIFAR).
        renorm_blocks (Sequence[int]): Default: (0, ) (official CIFAR).
        **kwargs: :class:`CIFARLayoutMixin` and :class:`KCLAResNet`.
    """

    def __init__(self,
                 head_dim: int = 16,
                 renorm_blocks: Sequence[int] = (0, ),
                 **kwargs):
        super().__init__(
            head_dim=head_dim, renorm_blocks=renorm_blocks, **kwargs)


@register_backbone()
class LAResNetCIFAR(CIFARLayoutMixin, LAResNet):
    """Full layer attention in the CIFAR layout, the quadratic baseline of
    :class:`KCLAResNetCIFAR`.

    Args:
        head_dim (int): Default: 16 (as KCLA on CIFAR).
        **kwargs: :class:`CIFARLayoutMixin` and :class:`LAResNet`.
    """

    def __init__(self, head_dim: int = 16, **kwargs):
        super().__init__(head_dim=head_dim, **kwargs)


@register_backbone()
class MRLALightResNetCIFAR(CIFARLayoutMixin, MRLALightResNet):
    """MRLA-light in the CIFAR layout, the linear baseline of
    :class:`KCLAResNetCIFAR`.

    Args:
        head_dim (int): Default: 16 (as KCLA on CIFAR).
        **kwargs: :class:`CIFARLayoutMixin` and :class:`MRLALightResNet`.
    """

    def __init__(self, head_dim: int = 16, **kwargs):
        super().__init__(head_dim=head_dim, **kwargs)
