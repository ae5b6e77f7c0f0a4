# mmengine's FlexibleRunner with FSDPStrategy (FSDP1, one GPU per process):
# every residual block is an FSDP unit. A KCLA / LA / MRLA-light block calls
# its attention layer in its own forward, so the layer is sharded with its
# block (docs/distributed.md). mmengine 0.10.7's FSDPStrategy passes
# device_id=LOCAL_RANK: it needs CUDA.
runner_type = 'FlexibleRunner'
strategy = dict(
    type='FSDPStrategy',
    model_wrapper=dict(
        auto_wrap_policy=dict(type='residual_block_wrap_policy'),
        use_orig_params=True))
