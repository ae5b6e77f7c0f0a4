# The network of unet-paper_kcla-r18.py with MRLA-light (the linear baseline)
# in place of KCLA, head_dim 16.
_base_ = './unet-paper_r18.py'
model = dict(backbone=dict(type='MRLALightResNetUNetPaper', head_dim=16))
