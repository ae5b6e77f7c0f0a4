# KCLA-ResNet-50 backbone with the official KCLA defaults, in mmdet's
# ResNet-50 settings (frozen stem + stage 1, BN in eval mode). Detection and
# segmentation configs inherit it or copy its `backbone` dict.
custom_imports = dict(imports=['kcla_mm'], allow_failed_imports=False)

backbone = dict(
    type='KCLAResNet',
    depth=50,
    num_stages=4,
    out_indices=(0, 1, 2, 3),
    frozen_stages=1,
    norm_cfg=dict(type='BN', requires_grad=True),
    norm_eval=True,
    style='pytorch',
    # KCLA settings of the official ImageNet model
    head_dim=64,
    temperature_range=(0.7, 1 / 0.7),
    clamp=10.,
    kcla_drop_path=0.2,
    renorm_blocks=(0, 11),
    # Point this at a converted official checkpoint
    # (tools/model_converters/kcla_official2mm.py), e.g.
    # init_cfg=dict(type='Pretrained',
    #               checkpoint='checkpoints/kcla_r50_imagenet.pth'),
    init_cfg=None)
