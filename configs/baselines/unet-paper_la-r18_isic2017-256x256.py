# The paper's UNet (configs/kcla/unet-kcla-paper_isic2017-256x256.py) with
# standard layer attention (LA) in place of KCLA, for the paper's
# comparison: same encoder layout, decoder and recipe.
_base_ = [
    '../_base_/models/unet-paper_la-r18.py',
    '../_base_/datasets/isic2017_paper-256x256.py',
    'mmseg::_base_/default_runtime.py',
    '../_base_/schedules/paper-unet_adamw_300e.py'
]
model = dict(
    data_preprocessor=dict(mean=None, std=None, bgr_to_rgb=True),
    decode_head=dict(loss_decode=[dict(type='BCEDiceLoss')]))
log_processor = dict(by_epoch=True)
