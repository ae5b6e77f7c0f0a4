# Plain ResNet-50 on ImageNet-1k with the official KCLA recipe: the KCLA
# config with mmpretrain's ResNet as the backbone, so that the two differ
# in the layer attention only. Its checkpoints have mmdet's ResNet keys.
_base_ = '../kcla/kcla-r50_8xb32_in1k.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='ResNet',
        depth=50,
        num_stages=4,
        out_indices=(3, ),
        style='pytorch',
        # As the official torchvision-style ResNet: the last BN of each
        # block starts at zero.
        zero_init_residual=True))
