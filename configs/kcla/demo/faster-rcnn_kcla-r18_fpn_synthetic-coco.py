# The demo (`make demo`): Faster R-CNN with a narrow KCLA-ResNet-18, trained
# from scratch on CPU on the synthetic COCO set of
# tools/misc/make_synthetic_coco.py, evaluated with mmdet's CocoMetric.
# It is the COCO config with a small backbone, slim heads and small images.
_base_ = '../faster-rcnn_kcla-r50_fpn_1x_coco.py'

data_root = 'data/synthetic_coco/'
metainfo = dict(
    classes=('circle', 'rectangle', 'triangle'),
    palette=[(220, 20, 60), (0, 128, 255), (60, 180, 75)])
image_size = (256, 256)

model = dict(
    backbone=dict(
        depth=18,
        base_channels=32,
        head_dim=16,
        frozen_stages=-1,
        norm_eval=False,  # no ImageNet statistics to keep
        init_cfg=None),
    neck=dict(in_channels=[32, 64, 128, 256], out_channels=64),
    rpn_head=dict(
        in_channels=64, feat_channels=64, anchor_generator=dict(scales=[4])),
    roi_head=dict(
        bbox_roi_extractor=dict(out_channels=64),
        bbox_head=dict(in_channels=64, fc_out_channels=256, num_classes=3)),
    train_cfg=dict(
        rpn_proposal=dict(nms_pre=1000, max_per_img=300),
        rcnn=dict(sampler=dict(num=128))),
    test_cfg=dict(rpn=dict(nms_pre=500, max_per_img=100)))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='Resize', scale=image_size, keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=image_size, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(
        type='PackDetInputs',
        meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                   'scale_factor'))
]
train_dataloader = dict(
    batch_size=4,
    num_workers=1,
    dataset=dict(
        data_root=data_root, metainfo=metainfo, pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=4,
    num_workers=1,
    dataset=dict(
        data_root=data_root, metainfo=metainfo, pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val2017.json')
test_evaluator = val_evaluator

# mmdet's 1x schedule (12 epochs, SGD lr 0.02) with a shorter warm-up and a
# later first step; validated and saved once, after the last epoch.
max_epochs = 12
train_cfg = dict(val_interval=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=100),
    dict(
        type='MultiStepLR',
        begin=0,
        end=max_epochs,
        by_epoch=True,
        milestones=[9, 11],
        gamma=0.1)
]
default_hooks = dict(
    logger=dict(interval=10),
    checkpoint=dict(interval=max_epochs, max_keep_ckpts=1))
randomness = dict(seed=0)
