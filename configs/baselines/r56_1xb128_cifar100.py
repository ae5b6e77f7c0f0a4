# Plain ResNet-56 (Bottleneck, CIFAR layout) on CIFAR-100 with the official
# KCLA recipe: the KCLA config with kcla_mm's plain ResNetCIFAR.
_base_ = '../kcla/kcla-r56_1xb128_cifar100.py'

model = dict(
    backbone=dict(
        _delete_=True, type='ResNetCIFAR', depth=56, block='Bottleneck'))
