# The UNet of configs/kcla/unet_kcla-r18_kvasir-seg-256x256.py with standard
# layer attention (LA, LAResNet) in place of KCLA, for the paper's comparison.
_base_ = '../kcla/unet_kcla-r18_kvasir-seg-256x256.py'
model = dict(backbone=dict(type='LAResNet'))
