# Faster R-CNN R50-FPN 1x on COCO2017 with a KCLA-ResNet-50 that starts from
# plain ResNet-50 ImageNet weights (torchvision's, as mmdet's R50 configs):
# no KCLA ImageNet checkpoint is needed. zero_init_attention starts every
# KCLA branch at zero, so the detector starts exactly as mmdet's R50 one
# and the KCLA layers grow from there during detection training.
_base_ = 'mmdet::faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py'
custom_imports = dict(imports=['kcla_mm'], allow_failed_imports=False)
custom_hooks = [dict(type='RandomStateHook')]  # resume repeats the run

model = dict(
    backbone=dict(
        type='KCLAResNet',
        zero_init_attention=True,
        init_cfg=dict(type='Pretrained', checkpoint='torchvision://resnet50')))
