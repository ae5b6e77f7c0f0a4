# Kvasir-SEG in the layout of tools/dataset_converters/prepare_kvasir.py
# (by default the official 700 train / 300 val split, --random-split 880 /
# 120; the val split doubles as the test split): the ISIC
# 2017 settings with its own dataset and root.
_base_ = './isic2017.py'
dataset_type = 'KvasirSEGDataset'
data_root = 'data/kvasir-seg/'
_dataset = dict(type=dataset_type, data_root=data_root)
train_dataloader = dict(dataset=_dataset)
val_dataloader = dict(dataset=_dataset)
test_dataloader = dict(
    dataset=dict(
        _dataset,
        data_prefix=dict(img_path='img_dir/val', seg_map_path='ann_dir/val')))
