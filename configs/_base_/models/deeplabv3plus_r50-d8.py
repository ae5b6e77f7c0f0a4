# mmseg's own DeepLabV3+ with its dilated ResNetV1c-50 (output stride 8:
# strides (1, 2, 1, 1), dilations (1, 1, 2, 4), contract_dilation, ImageNet
# weights from open-mmlab://resnet50_v1c) for the binary medical sets as the
# UNet configs do them: 2 classes, cross-entropy + Dice loss on the decode
# head (the auxiliary FCN head keeps mmseg's 0.4 cross-entropy), 256x256.
# deeplabv3plus_kcla-r50-d8.py swaps in KCLAResNetV1c.
_base_ = 'mmseg::_base_/models/deeplabv3plus_r50-d8.py'
custom_imports = dict(imports=['kcla_mm'], allow_failed_imports=False)
custom_hooks = [dict(type='RandomStateHook')]  # resume repeats the run
crop_size = (256, 256)
model = dict(
    data_preprocessor=dict(size=crop_size),
    decode_head=dict(
        num_classes=2,
        loss_decode=[
            dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
            dict(type='DiceLoss', use_sigmoid=False, loss_weight=1.0)
        ]),
    auxiliary_head=dict(num_classes=2))
