# The UNet of configs/kcla/unet_kcla-r18_isic2018-256x256.py (narrow ResNet-18
# encoder, base_channels 32, head_dim 16, trained from scratch) with MRLA-light
# (MRLALightResNet) in place of KCLA, for the paper's comparison.
_base_ = '../kcla/unet_kcla-r18_isic2018-256x256.py'
model = dict(backbone=dict(type='MRLALightResNet'))
