# ISIC 2018 Task 1: the ISIC 2017 settings with its own dataset and root.
_base_ = './isic2017.py'
dataset_type = 'ISIC2018Dataset'
data_root = 'data/isic2018/'
_dataset = dict(type=dataset_type, data_root=data_root)
train_dataloader = dict(dataset=_dataset)
val_dataloader = dict(dataset=_dataset)
test_dataloader = dict(dataset=_dataset)
