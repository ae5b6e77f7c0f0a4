from .version import __version__
from .models import KCLALayer, KCLAResNet, KCLAState

__all__ = ['__version__', 'KCLAResNet', 'KCLALayer', 'KCLAState']
