from .kcla import KCLALayer, KCLAState
from .kcla_unet_layer import KCLAUNetLayer
from .la_layer import LALayer, LAState
from .mrla_light_layer import MRLALightLayer

__all__ = [
    'KCLALayer', 'KCLAState', 'KCLAUNetLayer', 'LALayer', 'LAState',
    'MRLALightLayer'
]
