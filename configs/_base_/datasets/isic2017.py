# ISIC 2017 Task 1 in the layout of tools/dataset_converters/prepare_isic.py,
# at 256x256 with flips and rotations; IoU and Dice (overall and lesion).
dataset_type = 'ISIC2017Dataset'
data_root = 'data/isic2017/'
image_size = (256, 256)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),
    dict(type='Resize', scale=image_size, keep_ratio=False),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='RandomFlip', prob=0.5, direction='vertical'),
    # rotated-in corners get seg_pad_val=255 and are ignored by the loss
    dict(type='RandomRotate', prob=0.5, degree=30),
    dict(type='PackSegInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=image_size, keep_ratio=False),
    dict(type='LoadAnnotations'),
    dict(type='PackSegInputs')
]

train_dataloader = dict(
    batch_size=8,
    num_workers=2,
    persistent_workers=True,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        data_prefix=dict(
            img_path='img_dir/train', seg_map_path='ann_dir/train'),
        pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=1,
    num_workers=2,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        data_prefix=dict(img_path='img_dir/val', seg_map_path='ann_dir/val'),
        pipeline=test_pipeline))
test_dataloader = dict(
    val_dataloader,
    dataset=dict(
        val_dataloader['dataset'],
        data_prefix=dict(img_path='img_dir/test',
                         seg_map_path='ann_dir/test')))
val_evaluator = dict(type='ForegroundIoUMetric', iou_metrics=['mIoU', 'mDice'])
test_evaluator = val_evaluator
