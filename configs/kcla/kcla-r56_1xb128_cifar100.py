# KCLA-ResNet-56 (Bottleneck) on CIFAR-100 with the official KCLA recipe:
# the model of the official cifar/models/cifar/KCLA.py, ResNet(depth=56,
# num_classes=100, block_name='Bottleneck', drop_path=0.2), as an mmpretrain
# ImageClassifier. data_root holds the extracted official python archive
# (data/cifar100/cifar-100-python/); nothing is downloaded.
_base_ = [
    'mmpretrain::_base_/datasets/cifar100_bs16.py',
    '../_base_/schedules/cifar_bs128_kcla-300e.py',
    'mmpretrain::_base_/default_runtime.py',
]
custom_imports = dict(imports=['kcla_mm'], allow_failed_imports=False)
custom_hooks = [dict(type='RandomStateHook')]  # resume repeats the run

model = dict(
    type='ImageClassifier',
    backbone=dict(
        type='KCLAResNetCIFAR',
        depth=56,
        block='Bottleneck',
        kcla_drop_path=0.2),
    neck=dict(type='GlobalAveragePooling'),
    head=dict(
        type='LinearClsHead',
        num_classes=100,
        in_channels=256,
        loss=dict(type='CrossEntropyLoss', loss_weight=1.0)))

# The official normalisation (cifar/cifar.py), in 0-255 RGB.
data_preprocessor = dict(
    mean=[125.307, 122.961, 113.8575], std=[51.5865, 50.847, 51.255])
train_dataloader = dict(
    batch_size=128, dataset=dict(data_root='data/cifar100', download=False))
val_dataloader = dict(
    batch_size=128, dataset=dict(data_root='data/cifar100', download=False))
test_dataloader = val_dataloader
