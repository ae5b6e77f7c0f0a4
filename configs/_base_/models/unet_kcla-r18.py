# UNet-style segmentor: a narrow KCLA-ResNet-18 encoder (the paper's UNet is
# small) and a top-down UNetHead back to full resolution, 2 classes,
# cross-entropy + Dice loss. unet_r18.py swaps in a plain ResNet-18 encoder.
custom_imports = dict(imports=['kcla_mm'], allow_failed_imports=False)
custom_hooks = [dict(type='RandomStateHook')]  # resume repeats the run
norm_cfg = dict(type='BN', requires_grad=True)
crop_size = (256, 256)
data_preprocessor = dict(
    type='SegDataPreProcessor',
    mean=[123.675, 116.28, 103.53],
    std=[58.395, 57.12, 57.375],
    bgr_to_rgb=True,
    pad_val=0,
    seg_pad_val=255,
    size=crop_size)
model = dict(
    type='EncoderDecoder',
    data_preprocessor=data_preprocessor,
    backbone=dict(
        type='KCLAResNet',
        depth=18,
        base_channels=32,
        head_dim=16,
        out_indices=(0, 1, 2, 3),
        frozen_stages=-1,
        norm_cfg=norm_cfg,
        norm_eval=False,
        style='pytorch',
        init_cfg=None),
    decode_head=dict(
        type='UNetHead',
        in_channels=[32, 64, 128, 256],
        in_index=[0, 1, 2, 3],
        decoder_channels=(128, 64, 32, 16, 16),
        extra_upsamples=2,
        channels=16,
        dropout_ratio=0.,
        num_classes=2,
        norm_cfg=norm_cfg,
        align_corners=False,
        loss_decode=[
            dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
            dict(type='DiceLoss', use_sigmoid=False, loss_weight=1.0)
        ]),
    train_cfg=dict(),
    test_cfg=dict(mode='whole'))
