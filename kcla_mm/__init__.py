from .version import __version__
from . import datasets, evaluation  # noqa: F401  registers into mmseg
from .models import KCLALayer, KCLAResNet, KCLAState, UNetHead

__all__ = [
    '__version__', 'KCLAResNet', 'KCLALayer', 'KCLAState', 'UNetHead'
]
