# Faster R-CNN R50-FPN 1x on COCO2017, with a KCLA-ResNet-50 backbone.
# The backbone starts from a converted official KCLA ImageNet checkpoint
# (tools/model_converters/kcla_official2mm.py); put it at the path below,
# relative to where you run tools/train.py, or override it with
#   --cfg-options model.backbone.init_cfg.checkpoint=PATH
_base_ = 'mmdet::faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py'
custom_imports = dict(imports=['kcla_mm'], allow_failed_imports=False)
custom_hooks = [dict(type='RandomStateHook')]  # resume repeats the run

model = dict(
    backbone=dict(
        type='KCLAResNet',
        init_cfg=dict(checkpoint='checkpoints/kcla_r50_imagenet.pth')))
