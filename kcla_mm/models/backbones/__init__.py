from .cifar_resnet import (CIFARLayoutMixin, KCLAResNetCIFAR, LAResNetCIFAR,
                           MRLALightResNetCIFAR, ResNetCIFAR)
from .cross_layer_resnet import (CrossLayerResLayer, CrossLayerResLayerMixin,
                                 CrossLayerResNet, CrossLayerResNetMixin,
                                 MMSegCrossLayerResLayer,
                                 MMSegCrossLayerResNet)
from .errors import (BackboneAssertionError, BackboneAttributeError,
                     BackboneIndexError, BackboneKeyError, BackboneTypeError)
from .kcla_resnet import KCLAResNet, KCLAResNetMixin
from .la_resnet import LAResNet, LAResNetMixin
from .mmseg_resnet import (MMSegKCLAResNet, MMSegKCLAResNetV1c,
                           MMSegKCLAResNetV1d, MMSegLAResNet, MMSegLAResNetV1c,
                           MMSegLAResNetV1d, MMSegMRLALightResNet,
                           MMSegMRLALightResNetV1c, MMSegMRLALightResNetV1d)
from .mrla_light_resnet import MRLALightResNet, MRLALightResNetMixin

__all__ = [
    'BackboneAssertionError', 'BackboneAttributeError', 'BackboneIndexError',
    'BackboneKeyError', 'BackboneTypeError', 'CIFARLayoutMixin',
    'CrossLayerResLayer', 'CrossLayerResLayerMixin', 'CrossLayerResNet',
    'CrossLayerResNetMixin', 'KCLAResNet', 'KCLAResNetCIFAR',
    'KCLAResNetMixin', 'LAResNet', 'LAResNetCIFAR', 'LAResNetMixin',
    'MMSegCrossLayerResLayer', 'MMSegCrossLayerResNet', 'MMSegKCLAResNet',
    'MMSegKCLAResNetV1c', 'MMSegKCLAResNetV1d', 'MMSegLAResNet',
    'MMSegLAResNetV1c', 'MMSegLAResNetV1d', 'MMSegMRLALightResNet',
    'MMSegMRLALightResNetV1c', 'MMSegMRLALightResNetV1d', 'MRLALightResNet',
    'MRLALightResNetCIFAR', 'MRLALightResNetMixin', 'ResNetCIFAR'
]
