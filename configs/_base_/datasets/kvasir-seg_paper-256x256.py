# Kvasir-SEG with the paper's data recipe: isic2017_paper-256x256.py with
# Kvasir-SEG's dataset, root and official normalisation values.
# Split: the official one, prepare_kvasir.py's default (700 train / 300 val
# ids of the official code's segmentation/data/kvasir/). As in the official
# code, the val split is also the test split (the official code picks its
# best checkpoint on it and reports on it).
_base_ = './isic2017_paper-256x256.py'
dataset_type = 'KvasirSEGDataset'
data_root = 'data/kvasir-seg/'
image_size = (256, 256)
# official myNormalize('kvasir'): training and evaluation (mean, std)
train_normalize = dict(type='MeanStdMinMaxNormalize', mean=96.582, std=24.0903)
test_normalize = dict(type='MeanStdMinMaxNormalize', mean=96.093, std=23.8102)
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
_dataset = dict(type=dataset_type, data_root=data_root)
train_dataloader = dict(dataset=dict(_dataset, pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(_dataset, pipeline=test_pipeline))
test_dataloader = dict(
    dataset=dict(
        _dataset,
        data_prefix=dict(img_path='img_dir/val', seg_map_path='ann_dir/val'),
        pipeline=test_pipeline))
