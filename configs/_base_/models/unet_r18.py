# The UNet of unet_kcla-r18.py with a plain ResNet-18 encoder of the same
# width (mmseg's ResNet) in place of the KCLA encoder.
_base_ = './unet_kcla-r18.py'
model = dict(
    backbone=dict(
        _delete_=True,
        type='ResNet',
        depth=18,
        # mmseg's ResNet widens the stem to 64 by default; KCLAResNet's stem
        # has base_channels (mmdet's rule), so the comparison needs it said.
        stem_channels=32,
        base_channels=32,
        out_indices=(0, 1, 2, 3),
        frozen_stages=-1,
        norm_cfg=dict(type='BN', requires_grad=True),
        norm_eval=False,
        style='pytorch',
        contract_dilation=True,
        init_cfg=None))
