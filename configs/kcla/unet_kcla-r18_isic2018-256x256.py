# UNet with a narrow KCLA-ResNet-18 encoder on isic2018, 256x256, mmseg's
# 20k-iteration schedule. Data: tools/dataset_converters/ (README), in
# data/isic2018/ or --cfg-options data_root=PATH.
_base_ = [
    '../_base_/models/unet_kcla-r18.py', '../_base_/datasets/isic2018.py',
    'mmseg::_base_/default_runtime.py',
    'mmseg::_base_/schedules/schedule_20k.py'
]
custom_imports = dict(imports=['kcla_mm'], allow_failed_imports=False)
# AdamW, as medical UNets are usually trained; mmseg's poly schedule.
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-3, betas=(0.9, 0.999),
                   weight_decay=0.01))
