from .kcla_layer import KCLALayer, KCLAState

__all__ = ['KCLALayer', 'KCLAState']
