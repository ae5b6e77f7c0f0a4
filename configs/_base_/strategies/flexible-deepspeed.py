# mmengine's FlexibleRunner with DeepSpeedStrategy (ZeRO stage 2, fp32),
# for a machine with DeepSpeed and CUDA (neither is in kcla_mm's CI
# stacks: docs/distributed.md). DeepSpeed takes the optimizer from
# optim_wrapper; mmengine needs its DeepSpeedOptimWrapper.
runner_type = 'FlexibleRunner'
strategy = dict(
    type='DeepSpeedStrategy',
    fp16=dict(enabled=False),
    zero_optimization=dict(
        stage=2, overlap_comm=True, contiguous_gradients=True),
    gradient_clipping=None,
    train_micro_batch_size_per_gpu=2)
optim_wrapper = dict(type='DeepSpeedOptimWrapper')
