# The paper's UNet-KCLA on Kvasir-SEG as the official segmentation/ code trains
# it: the official network (KCLA state carried through every block, as the
# paper's equations have it), its data recipe, BCE + Dice on one sigmoid
# channel, threshold 0.5, batch 8, 300 epochs of AdamW with the cycling
# cosine schedule. Data: tools/dataset_converters/ (docs/tools.md).
_base_ = [
    '../_base_/models/unet-paper_kcla-r18.py',
    '../_base_/datasets/kvasir-seg_paper-256x256.py',
    'mmseg::_base_/default_runtime.py',
    '../_base_/schedules/paper-unet_adamw_300e.py'
]
# The official normalisation is in the pipeline (MeanStdMinMaxNormalize):
# the preprocessor adds none, only BGR -> RGB (the official code reads RGB).
model = dict(
    data_preprocessor=dict(mean=None, std=None, bgr_to_rgb=True),
    decode_head=dict(loss_decode=[dict(type='BCEDiceLoss')]))
log_processor = dict(by_epoch=True)
