# The paper's data recipe (official segmentation/ code, configs/
# config_setting.py and utils.py), shared by isic2017_paper-256x256.py,
# isic2018_paper-256x256.py and kvasir-seg_paper-256x256.py, which add only
# what differs: dataset, root, split and the dataset's official normalisation.
# Training, in the official order: the official normalisation (mean/std, then
# per-image min-max to [0, 255]), horizontal flip, vertical flip, rotation in
# [0, 360) (p=0.5 each), bilinear resize to 256x256; evaluation:
# normalisation, resize, and the official five figures (official/fg_IoU, DSC,
# accuracy, sensitivity, specificity) from one pixel confusion matrix over the
# split, at 256x256. Batch 8, epoch-based. The paper configs' data
# preprocessor adds no mean/std (see configs/kcla/unet-kcla-paper_*.py).
# Layout, workers and splits: isic2017.py's.
_base_ = './isic2017.py'
image_size = (256, 256)
# The pipelines less the normalisation: each dataset's config puts its
# MeanStdMinMaxNormalize in, where the official code has it (training: after
# LoadAnnotations, train_pipeline[2]; evaluation: after LoadImageFromFile,
# test_pipeline[1]), and hands the result to its dataloaders.
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='RandomFlip', prob=0.5, direction='vertical'),
    dict(type='RandomRotateNearest', prob=0.5, degree=(0, 360)),
    dict(type='ResizeThresholdMask', scale=image_size),
    dict(type='PackSegInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),
    # evaluated at 256x256, as the official code (never back to the file's
    # size)
    dict(type='ResizeThresholdMask', scale=image_size, set_ori_shape=True),
    dict(type='PackSegInputs')
]
train_dataloader = dict(
    batch_size=8,
    sampler=dict(type='DefaultSampler', shuffle=True),
    dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = dict(dataset=dict(pipeline=test_pipeline))
val_evaluator = dict(_delete_=True, type='PooledPixelMetric', threshold=0.5)
test_evaluator = val_evaluator
