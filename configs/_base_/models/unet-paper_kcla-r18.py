# The segmentation network of the KCLA paper, as the official code builds it
# (github bgx666/KCLA, segmentation/models/UNet_kcla.py, UNet_kcla(3, 1)): a
# narrow KCLA-ResNet-18 encoder (7x7 stride-1 stem of 16 channels, no
# max-pool, stages of planes 32/64/128/128 with strides 2/2/2/1, the
# segmentation variant of the KCLA layer after every block) and the official
# UNet decoder, one sigmoid output (threshold 0.5), BCE + Dice.
# 1,545,569 trainable parameters, those the official network uses. One
# difference, deliberate: the KCLA state is carried through every block, as
# the paper's equations have it; the official file forgets it in every block
# of a stage but the first (backbone carry_state=False does the same).
# unet-paper_r18.py is the plain twin; unet-paper_la-r18.py and
# unet-paper_mrla-light-r18.py swap in LA and MRLA-light.
custom_imports = dict(imports=['kcla_mm'], allow_failed_imports=False)
custom_hooks = [dict(type='RandomStateHook')]  # resume repeats the run
norm_cfg = dict(type='BN', requires_grad=True)
crop_size = (256, 256)
# A plain preprocessor; the paper configs replace it with the official
# normalisation.
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
        type='KCLAResNetUNetPaper',
        depth=18,
        stem_channels=16,
        stage_planes=(32, 64, 128, 128),
        strides=(2, 2, 2, 1),
        out_indices=(0, 1, 2, 3),
        stem_output=True,
        head_dim=16,
        kcla_drop_path=0.2,
        carry_state=True,
        norm_cfg=norm_cfg,
        norm_eval=False,
        init_cfg=None),
    decode_head=dict(
        type='UNetPaperHead',
        in_channels=[16, 32, 64, 128, 128],
        in_index=[0, 1, 2, 3, 4],
        decoder_channels=(64, 32, 16, 16),
        channels=16,
        dropout_ratio=0.,
        num_classes=2,
        out_channels=1,
        threshold=0.5,
        norm_cfg=norm_cfg,
        align_corners=False,
        loss_decode=[
            dict(type='CrossEntropyLoss', use_sigmoid=True, loss_weight=1.0),
            dict(type='DiceLoss', loss_weight=1.0)
        ]),
    train_cfg=dict(),
    test_cfg=dict(mode='whole'))
