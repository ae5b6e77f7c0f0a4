# mmseg's 20k-iteration schedule (poly LR, checkpoints and validation every
# 2k iterations) with AdamW, as medical UNets are usually trained.
_base_ = 'mmseg::_base_/schedules/schedule_20k.py'
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(
        type='AdamW', lr=1e-3, betas=(0.9, 0.999), weight_decay=0.01))
