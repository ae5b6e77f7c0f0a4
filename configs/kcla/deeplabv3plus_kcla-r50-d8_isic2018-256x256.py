# mmseg's DeepLabV3+ with a dilated KCLA-ResNetV1c-50 encoder (output stride
# 8) on isic2018, 256x256, 2 classes, mmseg's 20k schedule with AdamW. Data:
# tools/dataset_converters/ (docs/tools.md), in data/isic2018/ or --cfg-options
# data_root=PATH.
_base_ = [
    '../_base_/models/deeplabv3plus_kcla-r50-d8.py',
    '../_base_/datasets/isic2018.py', 'mmseg::_base_/default_runtime.py',
    '../_base_/schedules/adamw_20k.py'
]
