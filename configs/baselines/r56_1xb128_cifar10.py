# Plain ResNet-56 (Bottleneck, CIFAR layout) on CIFAR-10 with the official
# KCLA recipe.
_base_ = '../kcla/kcla-r56_1xb128_cifar10.py'

model = dict(
    backbone=dict(
        _delete_=True, type='ResNetCIFAR', depth=56, block='Bottleneck'))
