# The official KCLA CIFAR recipe (github bgx666/KCLA, cifar/cifar.py and
# README): SGD lr 0.1, momentum 0.9, weight decay 5e-4, batch 128,
# 300 epochs, x0.1 at epochs 150 and 225.
optim_wrapper = dict(
    optimizer=dict(type='SGD', lr=0.1, momentum=0.9, weight_decay=5e-4))
param_scheduler = dict(
    type='MultiStepLR', by_epoch=True, milestones=[150, 225], gamma=0.1)
train_cfg = dict(by_epoch=True, max_epochs=300, val_interval=1)
val_cfg = dict()
test_cfg = dict()
auto_scale_lr = dict(base_batch_size=128)
