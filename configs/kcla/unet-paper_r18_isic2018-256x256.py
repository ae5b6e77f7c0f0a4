# The plain-ResNet twin of unet-kcla-paper_isic2018-256x256.py (the paper's
# ResNet-UNet baseline): the same encoder layout and decoder without KCLA,
# the same recipe.
_base_ = [
    '../_base_/models/unet-paper_r18.py',
    '../_base_/datasets/isic2018_paper-256x256.py',
    'mmseg::_base_/default_runtime.py',
    '../_base_/schedules/paper-unet_adamw_300e.py'
]
model = dict(
    data_preprocessor=dict(mean=None, std=None, bgr_to_rgb=True),
    decode_head=dict(loss_decode=[dict(type='BCEDiceLoss')]))
log_processor = dict(by_epoch=True)
