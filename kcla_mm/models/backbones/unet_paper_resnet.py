# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""The encoder of the paper's segmentation network (UNet-KCLA), with and
without layer attention.

The official segmentation code (github bgx666/KCLA,
``segmentation/models/UNet_kcla.py`` with ``models/kcla/kcla_forU.py``,
``UNet_kcla(n_channels=3, n_classes=1)``) encodes with a narrow
ResNet-18: a 7x7 stem of 16 channels with stride 1 and no max-pool, then
four stages of two BasicBlocks with planes 32/64/128/128 and strides
2/2/2/1, and hands the decoder five maps: the stem's and each stage's
(16x256x256, 32x128x128, 64x64x64, 128x32x32 and 128x32x32 for a 256x256
image). mmdet's ``ResNet`` doubles the width at every stage, so the stage
widths are an option here (``stage_planes``).

Each class is its ImageNet counterpart (mmdet's ``ResNet``,
:class:`~.la_resnet.LAResNet`, :class:`~.mrla_light_resnet.MRLALightResNet`)
with :class:`UNetPaperLayoutMixin` in front, except the KCLA one, whose
layer is the segmentation variant of KCLA
(:class:`~kcla_mm.models.layers.kcla_unet_layer.KCLAUNetLayer`). All are in
mmdet's, mmseg's and (where installed) mmpretrain's MODELS.
"""
from typing import Optional, Sequence, Tuple

import torch.nn as nn
from mmcv.cnn import build_conv_layer, build_norm_layer
from mmdet.models.backbones import ResNet
from torch import Tensor

from ...registry import register_backbone
from ..layers.kcla_unet_layer import KCLAUNetLayer
from .arguments import (check_clamp, check_flag, check_int_sequence,
                        check_rate, check_resnet_args, check_temperature_range,
                        is_int)
from .cross_layer_resnet import CrossLayerResNet, CrossLayerResNetMixin
from .errors import BackboneTypeError
from .la_resnet import LAResNet
from .mrla_light_resnet import MRLALightResNet


class UNetPaperLayoutMixin:
    """Puts a ResNet class into the layout of the official UNet-KCLA
    encoder (see the module docstring).

    Put it before the ResNet class in the bases. The other ResNet options
    keep mmdet's names and meanings, with the official defaults; mmdet's
    deep stem, which replaces the 7x7 stem, does not apply.

    Args:
        depth (int): 18 or 34 (BasicBlock), 50, 101, 152. Default: 18.
        stem_channels (int): Width of the 7x7 stride-1 stem. Default: 16.
        stage_planes (Sequence[int]): Planes of each stage (the width is
            planes x the block's expansion), one per stage.
            Default: (32, 64, 128, 128).
        strides (Sequence[int]): Default: (2, 2, 2, 1).
        dilations (Sequence[int]): Default: (1, 1, 1, 1).
        out_indices (Sequence[int]): Stages whose outputs are returned.
            Default: (0, 1, 2, 3).
        stem_output (bool): Return the stem's output before the stages'
            (the decoder's full-resolution skip). Default: True.
        norm_eval (bool): Default: False (trained from scratch; mmdet's
            ResNet defaults to True for detection).
        zero_init_residual (bool): Default: False (the official network
            starts its blocks' last BN at 1).
        **kwargs: The other arguments of the ResNet class.
    """

    def __init__(self,
                 depth: int = 18,
                 stem_channels: int = 16,
                 stage_planes: Sequence[int] = (32, 64, 128, 128),
                 strides: Sequence[int] = (2, 2, 2, 1),
                 dilations: Sequence[int] = (1, 1, 1, 1),
                 out_indices: Sequence[int] = (0, 1, 2, 3),
                 stem_output: bool = True,
                 norm_eval: bool = False,
                 zero_init_residual: bool = False,
                 **kwargs):
        if kwargs.get('deep_stem'):
            raise ValueError('deep_stem=True does not apply to the UNet '
                             'paper layout, whose stem is one 7x7 conv')
        if 'base_channels' in kwargs:
            raise ValueError(
                'base_channels does not apply to the UNet paper layout: '
                'set stage_planes (the planes of every stage)')
        check_flag('stem_output', stem_output)
        num_stages = kwargs.get('num_stages', 4)
        planes = check_int_sequence('stage_planes', stage_planes)
        if not all(p >= 1 for p in planes):
            raise ValueError(
                f'stage_planes={planes} must be positive integers')
        if is_int(num_stages) and len(planes) != num_stages:
            raise ValueError(f'stage_planes={planes} must have num_stages='
                             f'{num_stages} entries, got {len(planes)}')
        self.stage_planes = planes
        self.stem_output = bool(stem_output)
        kwargs.update(
            stem_channels=stem_channels,
            base_channels=planes[0],
            strides=strides,
            dilations=dilations,
            out_indices=out_indices,
            norm_eval=norm_eval,
            zero_init_residual=zero_init_residual)
        self.in_channels = kwargs.get('in_channels', 3)
        if not isinstance(self, CrossLayerResNetMixin):
            # The layer-attention classes check them in _check_args.
            check_resnet_args(
                type(self).__name__, self.arch_settings, depth, kwargs)
        super().__init__(depth=depth, **kwargs)
        self.feat_dim = planes[-1] * self.block.expansion

    def _check_args(self, depth, head_dim, kwargs) -> None:
        # CrossLayerResNetMixin's checks, with head_dim checked against
        # stage_planes rather than base_channels * 2**i.
        check_resnet_args(
            type(self).__name__, self.arch_settings, depth, kwargs)
        check_flag('zero_init_attention', self.zero_init_attention)
        expansion = self.arch_settings[depth][0].expansion
        if not is_int(head_dim) or head_dim <= 0:
            raise BackboneTypeError(
                f'head_dim={head_dim!r} must be a positive integer that '
                'divides every stage width')
        for i, planes in enumerate(self.stage_planes):
            if (planes * expansion) % head_dim:
                raise ValueError(
                    f'head_dim={head_dim} must divide every stage width; '
                    f'stage {i} has width {planes * expansion} '
                    f'(stage_planes={self.stage_planes})')

    def train(self, mode: bool = True) -> nn.Module:
        # mmdet's ResNet.train() returns None.
        super().train(mode)
        return self

    def _make_stem_layer(self, in_channels: int, stem_channels: int) -> None:
        # As mmdet's stem (conv1, bn1 keys), 7x7 stride 1 and no max-pool.
        self.conv1 = build_conv_layer(
            self.conv_cfg,
            in_channels,
            stem_channels,
            kernel_size=7,
            stride=1,
            padding=3,
            bias=False)
        self.norm1_name, norm1 = build_norm_layer(
            self.norm_cfg, stem_channels, postfix=1)
        self.add_module(self.norm1_name, norm1)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.Identity()

    def make_res_layer(self, **kwargs) -> nn.Module:
        # mmdet's ResNet asks for base_channels * 2**i planes after
        # inplanes of the same rule; the layout's own widths replace both.
        i = len(self.res_layers)
        expansion = kwargs['block'].expansion
        kwargs['planes'] = self.stage_planes[i]
        kwargs['inplanes'] = (
            self.stem_channels if i == 0 else self.stage_planes[i - 1] *
            expansion)
        return super().make_res_layer(**kwargs)

    def forward(self, x: Tensor) -> Tuple[Tensor, ...]:
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(
                f'{type(self).__name__} expects input of shape (N, '
                f'in_channels={self.in_channels}, H, W), got '
                f'{tuple(x.shape)}')
        x = self.relu(self.norm1(self.conv1(x)))
        outs = [x] if self.stem_output else []
        threads_state = isinstance(self, CrossLayerResNetMixin)
        state = None
        for i, layer_name in enumerate(self.res_layers):
            layer = getattr(self, layer_name)
            if threads_state:
                x, state = layer(x, state)
            else:
                x = layer(x)
            if i in self.out_indices:
                outs.append(x)
        return tuple(outs)


@register_backbone()
class ResNetUNetPaper(UNetPaperLayoutMixin, ResNet):
    """The plain encoder of the official UNet-KCLA layout: the baseline of
    :class:`KCLAResNetUNetPaper`. Args: :class:`UNetPaperLayoutMixin` and
    mmdet's ``ResNet``.

    Example:
        >>> import torch
        >>> from kcla_mm.models.backbones import ResNetUNetPaper
        >>> self = ResNetUNetPaper().eval()
        >>> for out in self(torch.rand(1, 3, 64, 64)):
        ...     print(tuple(out.shape))
        (1, 16, 64, 64)
        (1, 32, 32, 32)
        (1, 64, 16, 16)
        (1, 128, 8, 8)
        (1, 128, 8, 8)
    """


@register_backbone()
class KCLAResNetUNetPaper(UNetPaperLayoutMixin, CrossLayerResNet):
    """The encoder of the official UNet-KCLA network: the layout of
    :class:`UNetPaperLayoutMixin` with a
    :class:`~kcla_mm.models.layers.kcla_unet_layer.KCLAUNetLayer` (the
    segmentation variant of KCLA) after every block, at ``layerN.J.kcla``.

    The state is carried through every block, as the paper's equations
    have it; the official file forgets it in every block of a stage but
    the first (``carry_state=False`` does the same). With the defaults the
    trainable parameters are those the official encoder uses; the modules
    it builds and never uses (a BatchNorm of 512 channels, stage 1 block
    0's state adapter) are not built.

    Args:
        head_dim (int): Channels per KCLA head. Default: 16 (official).
        temperature_range (Sequence[float]): See :class:`KCLAUNetLayer`.
            Default: (0.7, 1 / 0.7) (official).
        clamp (float): Upper bound of ||K|| / tau before ``exp``, in (0,
            88.72). Default: 10 (official).
        kcla_drop_path (float): Drop-path rate of the KCLA branch, in
            [0, 1). Default: 0.2 (official).
        renorm_blocks (Sequence[int]): Block indices (>= 0) within a stage
            whose layer carries the state to the stage (Algorithm 1); must
            contain 0. Default: (0, ) (official).
        carry_state (bool): Carry the state through the blocks of a stage
            (the paper). False: forget it after each stage's first block,
            as the official file does. Default: True.
        zero_init_attention (bool): Start every KCLA branch at zero, see
            :class:`~.cross_layer_resnet.CrossLayerResNetMixin`.
            Default: False.
        **kwargs: :class:`UNetPaperLayoutMixin` and mmdet's ``ResNet``.

    Example:
        >>> import torch
        >>> from kcla_mm.models.backbones import KCLAResNetUNetPaper
        >>> self = KCLAResNetUNetPaper().eval()
        >>> [tuple(out.shape) for out in self(torch.rand(1, 3, 64, 64))]
        [(1, 16, 64, 64), (1, 32, 32, 32), (1, 64, 16, 16), (1, 128, 8, 8), (1, 128, 8, 8)]
    """  # noqa: E501
    attention_name = 'kcla'

    def __init__(self,
                 head_dim: int = 16,
                 temperature_range: Sequence[float] = (0.7, 1 / 0.7),
                 clamp: float = 10.,
                 kcla_drop_path: float = 0.2,
                 renorm_blocks: Sequence[int] = (0, ),
                 carry_state: bool = True,
                 **kwargs):
        check_temperature_range('temperature_range', temperature_range)
        check_clamp('clamp', clamp)
        check_rate('kcla_drop_path', kcla_drop_path)
        check_flag('carry_state', carry_state)
        blocks = check_int_sequence('renorm_blocks', renorm_blocks)
        if 0 not in blocks or any(b < 0 for b in blocks):
            raise ValueError(
                f'renorm_blocks={blocks} must be block indices >= 0 and '
                'contain 0: the first block of every stage after the first '
                "carries the state to the stage (the paper's Algorithm 1)")
        self.renorm_blocks = blocks
        self.kcla_cfg = self.shared_layer_cfg(
            kwargs,
            head_dim=head_dim,
            temperature_range=tuple(temperature_range),
            clamp=clamp,
            drop_path=kcla_drop_path,
            carry_state=carry_state)
        super().__init__(head_dim=head_dim, **kwargs)

    def make_attention(self, channels: int, block_index: int,
                       state_channels: Optional[int],
                       state_stride: int) -> KCLAUNetLayer:
        return KCLAUNetLayer(
            channels,
            state_channels=state_channels,
            state_stride=state_stride,
            # The network's very first block has no state to carry.
            renorm=block_index in self.renorm_blocks
            and state_channels is not None,
            **self.kcla_cfg)


@register_backbone()
class LAResNetUNetPaper(UNetPaperLayoutMixin, LAResNet):
    """Full layer attention in the official UNet-KCLA encoder layout, the
    quadratic baseline of :class:`KCLAResNetUNetPaper`.

    Args:
        head_dim (int): Default: 16 (as KCLA there).
        **kwargs: :class:`UNetPaperLayoutMixin` and :class:`LAResNet`.
    """

    def __init__(self, head_dim: int = 16, **kwargs):
        super().__init__(head_dim=head_dim, **kwargs)


@register_backbone()
class MRLALightResNetUNetPaper(UNetPaperLayoutMixin, MRLALightResNet):
    """MRLA-light in the official UNet-KCLA encoder layout, the linear
    baseline of :class:`KCLAResNetUNetPaper`.

    Args:
        head_dim (int): Default: 16 (as KCLA there).
        **kwargs: :class:`UNetPaperLayoutMixin` and
            :class:`MRLALightResNet`.
    """

    def __init__(self, head_dim: int = 16, **kwargs):
        super().__init__(head_dim=head_dim, **kwargs)
