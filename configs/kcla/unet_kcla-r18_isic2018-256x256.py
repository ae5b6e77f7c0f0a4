# UNet with a narrow KCLA-ResNet-18 encoder on isic2018, 256x256, mmseg's 20k
# schedule with AdamW. Data: tools/dataset_converters/ (docs/tools.md), in
# data/isic2018/ or --cfg-options data_root=PATH.
_base_ = [
    '../_base_/models/unet_kcla-r18.py', '../_base_/datasets/isic2018.py',
    'mmseg::_base_/default_runtime.py', '../_base_/schedules/adamw_20k.py'
]
