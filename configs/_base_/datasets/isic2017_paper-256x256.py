# ISIC 2017 Task 1 with the paper's data recipe (official segmentation/
# code, configs/config_setting.py and utils.py). Training, in the official
# order: the official normalisation (mean/std, then per-image min-max to
# [0, 255]), horizontal flip, vertical flip, rotation in [0, 360) (p=0.5
# each), bilinear resize to 256x256; evaluation: normalisation, resize, and
# the official five figures (official/fg_IoU, DSC, accuracy, sensitivity,
# specificity) from one pixel confusion matrix over the split, at 256x256.
# Batch 8, epoch-based. The paper configs' data preprocessor adds no
# mean/std (see configs/kcla/unet-kcla-paper_*.py).
# ISIC protocol: the paper does not publish its ISIC split (the official code
# trains on a train/ folder and reports on val/, the folder it also picks
# its best checkpoint on). Here: prepare_isic.py's layout, the challenge's
# training set (2000) for training, its validation set (150) to pick the
# best checkpoint, its test set (600) for tools/test.py.
_base_ = './isic2017.py'
image_size = (256, 256)
# Official myNormalize('isic17'): (mean, std) of its training images, and
# others for evaluation. After the min-max step they change nothing (see
# MeanStdMinMaxNormalize); they are kept to compute what it computes.
train_normalize = dict(type='MeanStdMinMaxNormalize', mean=159.922, std=28.871)
test_normalize = dict(type='MeanStdMinMaxNormalize', mean=148.429, std=25.748)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'), train_normalize,
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='RandomFlip', prob=0.5, direction='vertical'),
    dict(type='RandomRotateNearest', prob=0.5, degree=(0, 360)),
    dict(type='ResizeThresholdMask', scale=image_size),
    dict(type='PackSegInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    test_normalize,
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
