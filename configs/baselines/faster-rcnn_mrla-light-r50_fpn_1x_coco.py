# Faster R-CNN R50-FPN 1x on COCO2017, with a ResNet-50 + MRLA-light backbone
# (MRLALightResNet), for the paper's comparison with
# configs/kcla/faster-rcnn_kcla-r50_fpn_1x_coco.py. No ImageNet checkpoint of
# this backbone exists in this layout: the ResNet part starts from plain
# ResNet-50 ImageNet weights (torchvision's resnet50 file, or mmdet's, saved at
# the path below; with torchvision installed,
# checkpoint='torchvision://resnet50' works too) and the layer-attention
# modules keep their own initialisation (loading reports them as missing keys).
# Override with
#   --cfg-options model.backbone.init_cfg.checkpoint=PATH
_base_ = 'mmdet::faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py'
custom_imports = dict(imports=['kcla_mm'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        type='MRLALightResNet',
        init_cfg=dict(
            type='Pretrained',
            checkpoint='checkpoints/resnet50_imagenet.pth')))
