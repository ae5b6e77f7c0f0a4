from .kcla_resnet import KCLAResNet
from .la_resnet import LAResNet
from .layer_attention_resnet import (LayerAttentionResLayer,
                                     LayerAttentionResNet)
from .mrlal_resnet import MRLALResNet

__all__ = [
    'KCLAResNet', 'LAResNet', 'LayerAttentionResLayer',
    'LayerAttentionResNet', 'MRLALResNet'
]
