from .version import __version__
from . import datasets, evaluation  # noqa: F401  registers into mmseg
from . import apis  # noqa: F401  model index, inferencers, allow-list
from .models import (KCLALayer, KCLAResNet, KCLAState, LAResNet, MRLALResNet,
                     UNetHead)

__all__ = [
    '__version__', 'KCLAResNet', 'KCLALayer', 'KCLAState', 'LAResNet',
    'MRLALResNet', 'UNetHead'
]
