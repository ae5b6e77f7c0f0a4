# The official KCLA ImageNet recipe (github bgx666/KCLA, imagenet/train.py
# and README): SGD lr 0.1, momentum 0.9, weight decay 1e-4 on every
# parameter, batch 256 in total, 100 epochs. Per epoch, as the official
# step_lr(): epoch 0 at the warm-up lr 1e-4, epochs 1 and 2 at 1/3 and 2/3
# of 0.1, then 0.1, x0.1 at epochs 40, 70 and 90.
optim_wrapper = dict(
    optimizer=dict(type='SGD', lr=0.1, momentum=0.9, weight_decay=1e-4))
param_scheduler = [
    # mmengine's ConstantLR restores the lr at its last epoch, end - 1:
    # end=2 gives 1e-4 at epoch 0 only.
    dict(type='ConstantLR', factor=1e-3, by_epoch=True, begin=0, end=2),
    # 1/3 at epoch 1, 2/3 at epoch 2, 1 from epoch 3.
    dict(type='LinearLR', start_factor=1 / 3, by_epoch=True, begin=1, end=4),
    dict(
        type='MultiStepLR', milestones=[40, 70, 90], gamma=0.1, by_epoch=True)
]
train_cfg = dict(by_epoch=True, max_epochs=100, val_interval=1)
val_cfg = dict()
test_cfg = dict()
# The recipe's total batch: `tools/train.py --auto-scale-lr` scales the lr
# linearly for another one.
auto_scale_lr = dict(base_batch_size=256)
