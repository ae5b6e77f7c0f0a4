from .cifar_resnet import (CIFARLayoutMixin, KCLAResNetCIFAR, LAResNetCIFAR,
                           MRLALightResNetCIFAR, ResNetCIFAR)
from .cross_layer_resnet import CrossLayerResLayer, CrossLayerResNet
from .kcla_resnet import KCLAResNet
from .la_resnet import LAResNet
from .mrla_light_resnet import MRLALightResNet

__all__ = [
    'CIFARLayoutMixin', 'CrossLayerResLayer', 'CrossLayerResNet', 'KCLAResNet',
    'KCLAResNetCIFAR', 'LAResNet', 'LAResNetCIFAR', 'MRLALightResNet',
    'MRLALightResNetCIFAR', 'ResNetCIFAR'
]
