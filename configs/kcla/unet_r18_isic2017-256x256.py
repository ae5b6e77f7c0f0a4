# The UNet of unet_kcla-r18_isic2017-256x256.py with a plain ResNet-18 encoder
# of the same width, for a side-by-side comparison with it.
_base_ = [
    '../_base_/models/unet_r18.py', '../_base_/datasets/isic2017.py',
    'mmseg::_base_/default_runtime.py', '../_base_/schedules/adamw_20k.py'
]
