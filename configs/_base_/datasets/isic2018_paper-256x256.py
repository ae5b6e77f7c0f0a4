# ISIC 2018 Task 1 with the paper's data recipe (paper-256x256.py) and ISIC
# 2018's dataset, root and official normalisation values.
# ISIC protocol: the paper does not publish its ISIC split. Here:
# prepare_isic.py's layout, the challenge's training set (2594) for
# training, its validation set (100) to pick the best checkpoint and its
# test set (1000) for tools/test.py; where only the training part is at hand,
# prepare_isic.py splits it 70/10/20 with a fixed seed.
_base_ = './paper-256x256.py'
dataset_type = 'ISIC2018Dataset'
data_root = 'data/isic2018/'
# official myNormalize('isic18'): training and evaluation (mean, std)
train_normalize = dict(type='MeanStdMinMaxNormalize', mean=157.561, std=26.706)
test_normalize = dict(type='MeanStdMinMaxNormalize', mean=149.034, std=32.022)
# paper-256x256.py's pipelines with the normalisation in its place
train_pipeline = [
    *_base_.train_pipeline[:2], train_normalize, *_base_.train_pipeline[2:]
]
test_pipeline = [
    _base_.test_pipeline[0], test_normalize, *_base_.test_pipeline[1:]
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
