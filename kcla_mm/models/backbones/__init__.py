# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""The registered layer-attention backbones. The machinery they share
(the cross-layer ResNet and ResLayer mixins, argument checks, errors) is
internal: import it from its module where a test or a subclass needs it."""
from .cifar_resnet import (KCLAResNetCIFAR, LAResNetCIFAR,
                           MRLALightResNetCIFAR, ResNetCIFAR)
from .kcla_resnet import KCLAResNet
from .la_resnet import LAResNet
from .mmseg_resnet import (MMSegKCLAResNet, MMSegKCLAResNetV1c,
                           MMSegKCLAResNetV1d, MMSegLAResNet, MMSegLAResNetV1c,
                           MMSegLAResNetV1d, MMSegMRLALightResNet,
                           MMSegMRLALightResNetV1c, MMSegMRLALightResNetV1d)
from .mrla_light_resnet import MRLALightResNet
from .unet_paper_resnet import (KCLAResNetUNetPaper, LAResNetUNetPaper,
                                MRLALightResNetUNetPaper, ResNetUNetPaper)

__all__ = [
    'KCLAResNet', 'KCLAResNetCIFAR', 'KCLAResNetUNetPaper', 'LAResNet',
    'LAResNetCIFAR', 'LAResNetUNetPaper', 'MMSegKCLAResNet',
    'MMSegKCLAResNetV1c', 'MMSegKCLAResNetV1d', 'MMSegLAResNet',
    'MMSegLAResNetV1c', 'MMSegLAResNetV1d', 'MMSegMRLALightResNet',
    'MMSegMRLALightResNetV1c', 'MMSegMRLALightResNetV1d', 'MRLALightResNet',
    'MRLALightResNetCIFAR', 'MRLALightResNetUNetPaper', 'ResNetCIFAR',
    'ResNetUNetPaper'
]
