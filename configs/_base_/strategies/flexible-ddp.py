# mmengine's FlexibleRunner with DDPStrategy: add to a config's _base_ list.
# On a machine without GPUs tools/train.py switches to gloo and sets
# model_wrapper.device_ids=None (kcla_mm.utils.distributed). KCLA needs no
# find_unused_parameters: every parameter gets a gradient at every step.
runner_type = 'FlexibleRunner'
strategy = dict(
    type='DDPStrategy',
    model_wrapper=dict(
        type='MMDistributedDataParallel', find_unused_parameters=False))
