from .bce_dice_loss import BCEDiceLoss

__all__ = ['BCEDiceLoss']
