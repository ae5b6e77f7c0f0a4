from mmdet.registry import MODELS as MMDET_MODELS
from mmseg.registry import MODELS as MMSEG_MODELS

from .backbones import KCLAResNet, LAResNet, MRLALResNet
from .decode_heads import UNetHead
from .layers import (KCLALayer, KCLAState, LALayer, LAState,
                     MRLALightLayer)

# One class, two registries: detection and segmentation configs both name it
# (type='KCLAResNet', 'LAResNet', 'MRLALResNet') under their own
# default_scope.
for _registry in (MMDET_MODELS, MMSEG_MODELS):
    for _backbone in (KCLAResNet, LAResNet, MRLALResNet):
        _registry.register_module(module=_backbone)

__all__ = [
    'KCLAResNet', 'KCLALayer', 'KCLAState', 'LAResNet', 'LALayer', 'LAState',
    'MRLALResNet', 'MRLALightLayer', 'UNetHead'
]
