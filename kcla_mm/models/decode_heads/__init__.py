from .unet_head import UNetHead

__all__ = ['UNetHead']
