from .unet_head import UNetHead
from .unet_paper_head import UNetPaperHead

__all__ = ['UNetHead', 'UNetPaperHead']
