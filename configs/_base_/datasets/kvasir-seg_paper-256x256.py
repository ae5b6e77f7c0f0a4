# Kvasir-SEG with the paper's data recipe (paper-256x256.py) and Kvasir-SEG's
# dataset, root and official normalisation values.
# Split: the official one, prepare_kvasir.py's default (700 train / 300 val
# ids of the official code's segmentation/data/kvasir/). As in the official
# code, the val split is also the test split (the official code picks its
# best checkpoint on it and reports on it).
_base_ = './paper-256x256.py'
dataset_type = 'KvasirSEGDataset'
data_root = 'data/kvasir-seg/'
# official myNormalize('kvasir'): training and evaluation (mean, std)
train_normalize = dict(type='MeanStdMinMaxNormalize', mean=96.582, std=24.0903)
test_normalize = dict(type='MeanStdMinMaxNormalize', mean=96.093, std=23.8102)
# paper-256x256.py's pipelines with the normalisation in its place
train_pipeline = [
    *_base_.train_pipeline[:2], train_normalize, *_base_.train_pipeline[2:]
]
test_pipeline = [
    _base_.test_pipeline[0], test_normalize, *_base_.test_pipeline[1:]
]
_dataset = dict(type=dataset_type, data_root=data_root)
train_dataloader = dict(dataset=dict(_dataset, pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(_dataset, pipeline=test_pipeline))
test_dataloader = dict(
    dataset=dict(
        _dataset,
        data_prefix=dict(img_path='img_dir/val', seg_map_path='ann_dir/val'),
        pipeline=test_pipeline))
