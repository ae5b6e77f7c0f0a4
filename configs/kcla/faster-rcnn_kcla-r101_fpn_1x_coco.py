# Faster R-CNN R101-FPN 1x on COCO2017, with a KCLA-ResNet-101 backbone: the
# R50 config with depth 101 (as mmdet's R101 configs are), starting from the
# KCLA-ResNet-101 ImageNet weights (configs/kcla/kcla-r101_8xb32_in1k.py, or a
# converted official checkpoint, as the R50 config says).
_base_ = './faster-rcnn_kcla-r50_fpn_1x_coco.py'
model = dict(
    backbone=dict(
        depth=101,
        init_cfg=dict(checkpoint='checkpoints/kcla_r101_imagenet.pth')))
