# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Backbones, layers and heads; each class registers itself where it is
defined (backbones in mmdet's and mmseg's MODELS, and mmpretrain's when
it is installed; the UNet heads and BCEDiceLoss in mmseg's)."""
from .backbones import (KCLAResNet, KCLAResNetCIFAR, KCLAResNetUNetPaper,
                        LAResNet, LAResNetCIFAR, LAResNetUNetPaper,
                        MRLALightResNet, MRLALightResNetCIFAR,
                        MRLALightResNetUNetPaper, ResNetCIFAR, ResNetUNetPaper)
from .decode_heads import UNetHead, UNetPaperHead
from .layers import (KCLALayer, KCLAState, KCLAUNetLayer, LALayer, LAState,
                     MRLALightLayer)
from .losses import BCEDiceLoss

__all__ = [
    'BCEDiceLoss', 'KCLAResNet', 'KCLAResNetCIFAR', 'KCLAResNetUNetPaper',
    'KCLALayer', 'KCLAState', 'KCLAUNetLayer', 'LAResNet', 'LAResNetCIFAR',
    'LAResNetUNetPaper', 'LALayer', 'LAState', 'MRLALightLayer',
    'MRLALightResNet', 'MRLALightResNetCIFAR', 'MRLALightResNetUNetPaper',
    'ResNetCIFAR', 'ResNetUNetPaper', 'UNetHead', 'UNetPaperHead'
]
