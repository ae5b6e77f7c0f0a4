# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""The layer-attention backbones in mmseg's registry, over mmseg's ResNet.

MMSegmentation configs use mmseg's own ``ResNet`` / ``ResNetV1c`` (deep
stem, output stride 8 through ``strides=(1, 2, 1, 1)``, ``dilations=(1, 1,
2, 4)`` and ``contract_dilation=True``, optionally ``multi_grid``). Under
``default_scope='mmseg'`` the names ``KCLAResNet``, ``LAResNet`` and
``MRLALightResNet`` (also ``MRLALResNet``) are the classes here: the same
attention as the mmdet-based classes of the same names, over mmseg's
``ResNet``, with every mmseg option and state-dict key, and the ``V1c``
(``deep_stem=True, avg_down=False``) and ``V1d`` (``deep_stem=True,
avg_down=True``) variants as mmseg defines them. The state crosses a
dilated stage of stride 1 through Algorithm 1's adapter without a stride.
"""
from ...registry import register_backbone
from .cross_layer_resnet import MMSegCrossLayerResNet
from .kcla_resnet import KCLAResNetMixin
from .la_resnet import LAResNetMixin
from .mrla_light_resnet import MRLALightResNetMixin


class ResNetV1cMixin:
    """mmseg's ResNetV1c: a deep stem of three 3x3 convs."""

    def __init__(self, **kwargs):
        super().__init__(deep_stem=True, avg_down=False, **kwargs)


class ResNetV1dMixin:
    """mmseg's ResNetV1d: a deep stem, and an average pool before the 1x1
    conv of each downsampling shortcut."""

    def __init__(self, **kwargs):
        super().__init__(deep_stem=True, avg_down=True, **kwargs)


def register_in_mmseg(*names: str):
    return register_backbone(
        name=list(names) if len(names) > 1 else names[0],
        registries=('mmseg', ))


@register_in_mmseg('KCLAResNet')
class MMSegKCLAResNet(KCLAResNetMixin, MMSegCrossLayerResNet):
    """KCLA-ResNet over mmseg's ResNet, ``KCLAResNet`` in mmseg's registry.

    Args: the KCLA arguments of :class:`~.kcla_resnet.KCLAResNet` and those
    of :class:`~.cross_layer_resnet.MMSegCrossLayerResNet` (mmseg's
    ``ResNet``: ``multi_grid``, ``contract_dilation``, ``stem_channels``,
    ``deep_stem``, ``avg_down``, ``strides``, ``dilations``, ...).

    Example:
        >>> import torch
        >>> from kcla_mm.models.backbones import MMSegKCLAResNetV1c
        >>> self = MMSegKCLAResNetV1c(
        ...     depth=50, base_channels=16, head_dim=16,
        ...     strides=(1, 2, 1, 1), dilations=(1, 1, 2, 4),
        ...     contract_dilation=True).eval()
        >>> for out in self(torch.rand(1, 3, 64, 64)):
        ...     print(tuple(out.shape))
        (1, 64, 16, 16)
        (1, 128, 8, 8)
        (1, 256, 8, 8)
        (1, 512, 8, 8)
    """


@register_in_mmseg('KCLAResNetV1c')
class MMSegKCLAResNetV1c(ResNetV1cMixin, MMSegKCLAResNet):
    """:class:`MMSegKCLAResNet` with mmseg's ResNetV1c layout."""


@register_in_mmseg('KCLAResNetV1d')
class MMSegKCLAResNetV1d(ResNetV1dMixin, MMSegKCLAResNet):
    """:class:`MMSegKCLAResNet` with mmseg's ResNetV1d layout."""


@register_in_mmseg('LAResNet')
class MMSegLAResNet(LAResNetMixin, MMSegCrossLayerResNet):
    """LA-ResNet over mmseg's ResNet, ``LAResNet`` in mmseg's registry.
    Args: those of :class:`~.la_resnet.LAResNet` and of mmseg's
    ``ResNet`` (see :class:`MMSegKCLAResNet`)."""


@register_in_mmseg('LAResNetV1c')
class MMSegLAResNetV1c(ResNetV1cMixin, MMSegLAResNet):
    """:class:`MMSegLAResNet` with mmseg's ResNetV1c layout."""


@register_in_mmseg('LAResNetV1d')
class MMSegLAResNetV1d(ResNetV1dMixin, MMSegLAResNet):
    """:class:`MMSegLAResNet` with mmseg's ResNetV1d layout."""


@register_in_mmseg('MRLALightResNet', 'MRLALResNet')
class MMSegMRLALightResNet(MRLALightResNetMixin, MMSegCrossLayerResNet):
    """MRLA-light ResNet over mmseg's ResNet, ``MRLALightResNet`` in
    mmseg's registry. Args: those of
    :class:`~.mrla_light_resnet.MRLALightResNet` and of mmseg's ``ResNet``
    (see :class:`MMSegKCLAResNet`)."""


@register_in_mmseg('MRLALightResNetV1c')
class MMSegMRLALightResNetV1c(ResNetV1cMixin, MMSegMRLALightResNet):
    """:class:`MMSegMRLALightResNet` with mmseg's ResNetV1c layout."""


@register_in_mmseg('MRLALightResNetV1d')
class MMSegMRLALightResNetV1d(ResNetV1dMixin, MMSegMRLALightResNet):
    """:class:`MMSegMRLALightResNet` with mmseg's ResNetV1d layout."""
