# ISIC 2017 Task 1 with the paper's data recipe (paper-256x256.py) and ISIC
# 2017's official normalisation values.
# ISIC protocol: the paper does not publish its ISIC split (the official code
# trains on a train/ folder and reports on val/, the folder it also picks
# its best checkpoint on). Here: prepare_isic.py's layout, the challenge's
# training set (2000) for training, its validation set (150) to pick the
# best checkpoint, its test set (600) for tools/test.py.
_base_ = './paper-256x256.py'
# Official myNormalize('isic17'): (mean, std) of its training images, and
# others for evaluation. After the min-max step they change nothing (see
# MeanStdMinMaxNormalize); they are kept to compute what it computes.
train_normalize = dict(type='MeanStdMinMaxNormalize', mean=159.922, std=28.871)
test_normalize = dict(type='MeanStdMinMaxNormalize', mean=148.429, std=25.748)
# paper-256x256.py's pipelines with the normalisation in its place
train_pipeline = [
    *_base_.train_pipeline[:2], train_normalize, *_base_.train_pipeline[2:]
]
test_pipeline = [
    _base_.test_pipeline[0], test_normalize, *_base_.test_pipeline[1:]
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = dict(dataset=dict(pipeline=test_pipeline))
