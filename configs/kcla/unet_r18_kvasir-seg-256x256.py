# The same UNet with a plain ResNet-18 encoder of the same width, for a
# side-by-side comparison with unet_kcla-r18_kvasir-seg-256x256.py.
_base_ = './unet_kcla-r18_kvasir-seg-256x256.py'
model = dict(
    backbone=dict(
        _delete_=True,
        type='ResNet',
        depth=18,
        base_channels=32,
        out_indices=(0, 1, 2, 3),
        frozen_stages=-1,
        norm_cfg={{_base_.norm_cfg}},
        norm_eval=False,
        style='pytorch',
        contract_dilation=True,
        init_cfg=None))
