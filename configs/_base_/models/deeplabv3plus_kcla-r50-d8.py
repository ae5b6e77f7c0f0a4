# The DeepLabV3+ of deeplabv3plus_r50-d8.py with KCLAResNetV1c in place of
# mmseg's ResNetV1c: every mmseg option of the dilated backbone kept, a KCLA
# layer after every block. No KCLA ResNetV1c ImageNet checkpoint exists: the
# ResNet part starts from the same open-mmlab://resnet50_v1c weights as the
# baseline and, with zero_init_attention, every KCLA branch starts at zero
# (the network computes the baseline's features at step 0) and grows.
_base_ = './deeplabv3plus_r50-d8.py'
model = dict(backbone=dict(type='KCLAResNetV1c', zero_init_attention=True))
