# KCLA-ResNet-56 (Bottleneck) on CIFAR-10 with the official KCLA recipe.
# data_root holds the extracted official python archive
# (data/cifar10/cifar-10-batches-py/).
_base_ = './kcla-r56_1xb128_cifar100.py'

model = dict(head=dict(num_classes=10))
data_preprocessor = dict(num_classes=10)
train_dataloader = dict(dataset=dict(type='CIFAR10', data_root='data/cifar10'))
val_dataloader = dict(dataset=dict(type='CIFAR10', data_root='data/cifar10'))
test_dataloader = val_dataloader
