from .cross_layer_resnet import CrossLayerResLayer, CrossLayerResNet
from .kcla_resnet import KCLAResNet
from .la_resnet import LAResNet
from .mrla_light_resnet import MRLALightResNet

__all__ = [
    'CrossLayerResLayer', 'CrossLayerResNet', 'KCLAResNet', 'LAResNet',
    'MRLALightResNet'
]
