# The network of unet-paper_kcla-r18.py without KCLA: the same encoder layout
# and decoder, plain BasicBlocks; the baseline the paper compares with.
_base_ = './unet-paper_kcla-r18.py'
model = dict(
    backbone=dict(
        _delete_=True,
        type='ResNetUNetPaper',
        depth=18,
        stem_channels=16,
        stage_planes=(32, 64, 128, 128),
        strides=(2, 2, 2, 1),
        out_indices=(0, 1, 2, 3),
        stem_output=True,
        norm_cfg=dict(type='BN', requires_grad=True),
        norm_eval=False,
        init_cfg=None))
