from mmdet.registry import MODELS as MMDET_MODELS
from mmseg.registry import MODELS as MMSEG_MODELS

from .backbones import KCLAResNet
from .decode_heads import UNetHead
from .layers import KCLALayer, KCLAState

# One class, two registries: detection and segmentation configs both name it
# type='KCLAResNet' under their own default_scope.
for _registry in (MMDET_MODELS, MMSEG_MODELS):
    _registry.register_module(module=KCLAResNet)

__all__ = ['KCLAResNet', 'KCLALayer', 'KCLAState', 'UNetHead']
