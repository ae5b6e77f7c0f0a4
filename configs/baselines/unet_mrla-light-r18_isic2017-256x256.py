# The UNet of configs/kcla/unet_kcla-r18_isic2017-256x256.py with MRLA-light
# (MRLALightResNet) in place of KCLA, for the paper's comparison.
_base_ = '../kcla/unet_kcla-r18_isic2017-256x256.py'
model = dict(backbone=dict(type='MRLALightResNet'))
