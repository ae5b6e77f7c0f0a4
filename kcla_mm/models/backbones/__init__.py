from .kcla_resnet import KCLAResLayer, KCLAResNet

__all__ = ['KCLAResLayer', 'KCLAResNet']
