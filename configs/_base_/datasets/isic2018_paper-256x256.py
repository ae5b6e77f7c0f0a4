# ISIC 2018 Task 1 with the paper's data recipe: isic2017_paper-256x256.py
# with ISIC 2018's dataset, root and official normalisation values.
# ISIC protocol: the paper does not publish its ISIC split. Here:
# prepare_isic.py's layout, the challenge's training set (2594) for
# training, its validation set (100) to pick the best checkpoint and its
# test set (1000) for tools/test.py; where only the training part is at hand,
# prepare_isic.py splits it 70/10/20 with a fixed seed.
_base_ = './isic2017_paper-256x256.py'
dataset_type = 'ISIC2018Dataset'
data_root = 'data/isic2018/'
image_size = (256, 256)
# official myNormalize('isic18'): training and evaluation (mean, std)
train_normalize = dict(type='MeanStdMinMaxNormalize', mean=157.561, std=26.706)
test_normalize = dict(type='MeanStdMinMaxNormalize', mean=149.034, std=32.022)
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
    dict(type='LoadImageFromFile'), test_normalize,
    dict(type='LoadAnnotations'),
    dict(type='ResizeThresholdMask', scale=image_size, set_ori_shape=True),
    dict(type='PackSegInputs')
]
train_dataloader = dict(
    dataset=dict(
        type=dataset_type, data_root=data_root, pipeline=train_pipeline))
val_dataloader = dict(
    dataset=dict(
        type=dataset_type, data_root=data_root, pipeline=test_pipeline))
test_dataloader = dict(
    dataset=dict(
        type=dataset_type, data_root=data_root, pipeline=test_pipeline))
