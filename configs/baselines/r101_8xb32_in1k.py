# Plain ResNet-101 on ImageNet-1k with the official KCLA recipe.
_base_ = './r50_8xb32_in1k.py'

model = dict(backbone=dict(depth=101))
