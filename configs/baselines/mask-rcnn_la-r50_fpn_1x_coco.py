# Mask R-CNN R50-FPN 1x on COCO2017 with standard layer attention (LA,
# LAResNet), for the paper's comparison with
# configs/kcla/mask-rcnn_kcla-r50_fpn_1x_coco.py.
_base_ = './_base_/mask-rcnn_resnet50-imagenet_fpn_1x_coco.py'
model = dict(backbone=dict(type='LAResNet'))
