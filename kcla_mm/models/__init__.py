# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Backbones, layers and heads; each class registers itself where it is
defined (backbones in mmdet's and mmseg's MODELS, and mmpretrain's when
it is installed; the UNet head and BCEDiceLoss in mmseg's)."""
from .backbones import (KCLAResNet, KCLAResNetCIFAR, LAResNet, LAResNetCIFAR,
                        MRLALightResNet, MRLALightResNetCIFAR, ResNetCIFAR)
from .decode_heads import UNetHead
from .layers import KCLALayer, KCLAState, LALayer, LAState, MRLALightLayer
from .losses import BCEDiceLoss

__all__ = [
    'BCEDiceLoss', 'KCLAResNet', 'KCLAResNetCIFAR', 'KCLALayer', 'KCLAState',
    'LAResNet', 'LAResNetCIFAR', 'LALayer', 'LAState', 'MRLALightLayer',
    'MRLALightResNet', 'MRLALightResNetCIFAR', 'ResNetCIFAR', 'UNetHead'
]
