# KCLA-ResNet-50 on ImageNet-1k with the official KCLA recipe: mmpretrain's
# ResNet-50 classifier with the backbone swapped. Data: data/imagenet with
# either the class-folder layout of the official script
# (train/<wnid>/*.JPEG, val/<wnid>/*.JPEG) or mmpretrain's (meta/train.txt,
# meta/val.txt); PIL resizing, as torchvision's transforms there.
_base_ = [
    'mmpretrain::_base_/models/resnet50.py',
    'mmpretrain::_base_/datasets/imagenet_bs32_pil_resize.py',
    '../_base_/schedules/imagenet_bs256_kcla-100e.py',
    'mmpretrain::_base_/default_runtime.py',
]
custom_imports = dict(imports=['kcla_mm'], allow_failed_imports=False)
custom_hooks = [dict(type='RandomStateHook')]  # resume repeats the run

model = dict(
    backbone=dict(
        type='KCLAResNet',
        kcla_drop_path=0.2,
        # mmdet's ResNet defaults to frozen BN statistics (detection); a
        # classifier trains them.
        norm_eval=False))
