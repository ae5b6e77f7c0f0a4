# Shared by the baselines' Mask R-CNN configs: mmdet's Mask R-CNN R50-FPN 1x
# on COCO2017, the setting of configs/kcla/mask-rcnn_kcla-r50_fpn_1x_coco.py,
# with the backbone's ResNet part starting from plain ResNet-50 ImageNet
# weights, as in faster-rcnn_resnet50-imagenet_fpn_1x_coco.py (see there).
_base_ = 'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py'
custom_imports = dict(imports=['kcla_mm'], allow_failed_imports=False)
custom_hooks = [dict(type='RandomStateHook')]  # resume repeats the run

model = dict(
    backbone=dict(
        init_cfg=dict(checkpoint='checkpoints/resnet50_imagenet.pth')))
