# Faster R-CNN R50-FPN 1x on COCO2017 with MRLA-light (MRLALightResNet), for
# the paper's comparison with configs/kcla/faster-rcnn_kcla-r50_fpn_1x_coco.py.
_base_ = './_base_/faster-rcnn_resnet50-imagenet_fpn_1x_coco.py'
model = dict(backbone=dict(type='MRLALightResNet'))
