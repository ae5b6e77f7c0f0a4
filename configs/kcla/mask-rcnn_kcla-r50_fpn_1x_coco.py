# Mask R-CNN R50-FPN 1x on COCO2017, with a KCLA-ResNet-50 backbone.
# The backbone starts from KCLA-ResNet-50 ImageNet weights: trained with
# configs/kcla/kcla-r50_8xb32_in1k.py, or an official checkpoint (the official
# repository publishes none) converted with
# tools/model_converters/kcla_official2mm.py. Without either, start from plain
# ResNet weights as faster-rcnn_kcla-r50-warmstart_fpn_1x_coco.py does. Put
# the file at the path below, relative to where you run tools/train.py, or
# override it with
#   --cfg-options model.backbone.init_cfg.checkpoint=PATH
_base_ = 'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py'
custom_imports = dict(imports=['kcla_mm'], allow_failed_imports=False)
custom_hooks = [dict(type='RandomStateHook')]  # resume repeats the run

model = dict(
    backbone=dict(
        type='KCLAResNet',
        init_cfg=dict(checkpoint='checkpoints/kcla_r50_imagenet.pth')))
