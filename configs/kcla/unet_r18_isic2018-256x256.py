# The same UNet with a plain ResNet-18 encoder of the same width, for a
# side-by-side comparison with unet_kcla-r18_isic2018-256x256.py.
_base_ = './unet_kcla-r18_isic2018-256x256.py'
model = dict(backbone={{_base_.plain_r18_backbone}})
