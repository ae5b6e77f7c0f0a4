# Shared by the baselines' Faster R-CNN configs: mmdet's Faster R-CNN R50-FPN
# 1x on COCO2017, the setting of
# configs/kcla/faster-rcnn_kcla-r50_fpn_1x_coco.py.
# The leaf configs swap in a layer-attention backbone (model.backbone.type).
# No ImageNet checkpoint of those backbones exists in this layout: their
# ResNet part starts from plain ResNet-50 ImageNet weights (torchvision's
# resnet50 file, or mmdet's, saved at the path below; with torchvision
# installed, checkpoint='torchvision://resnet50' works too) and the
# layer-attention modules keep their own initialisation (loading reports them
# as missing keys). Override with
#   --cfg-options model.backbone.init_cfg.checkpoint=PATH
_base_ = 'mmdet::faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py'
custom_imports = dict(imports=['kcla_mm'], allow_failed_imports=False)
custom_hooks = [dict(type='RandomStateHook')]  # resume repeats the run

model = dict(
    backbone=dict(
        init_cfg=dict(checkpoint='checkpoints/resnet50_imagenet.pth')))
