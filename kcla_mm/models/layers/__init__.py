from .kcla import KCLALayer, KCLAState
from .la_layer import LALayer, LAState
from .mrla_light_layer import MRLALightLayer

__all__ = ['KCLALayer', 'KCLAState', 'LALayer', 'LAState', 'MRLALightLayer']
