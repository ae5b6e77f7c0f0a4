# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Distributed runs of mmengine's Runner on machines without GPUs."""
import torch
from mmengine.config import Config, ConfigDict


def cpu_distributed_defaults(cfg: Config) -> None:
    """Lets the same config train distributed on a CPU-only machine.

    The configs ask for NCCL, which needs GPUs: use gloo instead (an
    explicit ``env_cfg.dist_cfg.backend`` other than nccl is kept). mmengine
    wraps the model in DDP with ``device_ids=[LOCAL_RANK]``, which DDP
    refuses for CPU modules: ask for ``device_ids=None`` (in
    ``model_wrapper_cfg``, and in a FlexibleRunner's DDPStrategy). With a
    GPU the config is left as it is.

    Args:
        cfg (Config): The config, changed in place.
    """
    if torch.cuda.is_available():
        return
    dist_cfg = cfg.setdefault('env_cfg',
                              ConfigDict()).setdefault('dist_cfg',
                                                       ConfigDict())
    if dist_cfg.get('backend', 'nccl') == 'nccl':
        dist_cfg.backend = 'gloo'
    wrapper = cfg.get('model_wrapper_cfg') or ConfigDict(
        type='MMDistributedDataParallel')
    wrapper.setdefault('device_ids', None)
    cfg.model_wrapper_cfg = wrapper
    # FlexibleRunner: a DDPStrategy builds its own wrapper, with the same
    # device_ids default.
    strategy = cfg.get('strategy')
    if (cfg.get('runner_type') == 'FlexibleRunner' and strategy is not None
            and strategy.get('type') == 'DDPStrategy'):
        wrapper = strategy.get('model_wrapper') or ConfigDict(
            type='MMDistributedDataParallel')
        wrapper.setdefault('device_ids', None)
        strategy.model_wrapper = wrapper
    # An FSDPStrategy passes device_id=LOCAL_RANK, a CUDA device: FSDP
    # runs on the CPU with the CPU device (torch >= 2.4).
    if (cfg.get('runner_type') == 'FlexibleRunner' and strategy is not None
            and strategy.get('type') == 'FSDPStrategy'):
        wrapper = strategy.get('model_wrapper') or ConfigDict()
        wrapper.setdefault('device_id', torch.device('cpu'))
        strategy.model_wrapper = wrapper


def init_distributed_on_cpu(cfg: Config) -> None:
    """Starts the process group of a ``launcher='pytorch'`` config without
    GPUs.

    mmengine 0.10.7's pytorch launcher calls ``torch.cuda.set_device``
    before ``init_process_group``, which fails on a CPU-only torch; once a
    group exists, the Runner uses it as it is. Does nothing for other
    launchers, with a GPU, or when a group exists.

    Args:
        cfg (Config): The config of the run (``launcher`` and
            ``env_cfg.dist_cfg`` are read).
    """
    import torch.distributed as dist
    if (cfg.get('launcher', 'none') != 'pytorch' or torch.cuda.is_available()
            or dist.is_initialized()):
        return
    dist_cfg = dict(cfg.get('env_cfg', {}).get('dist_cfg', {}))
    backend = dist_cfg.pop('backend', 'gloo')
    timeout = dist_cfg.pop('timeout', None)
    kwargs = {}
    if timeout is not None:
        from datetime import timedelta
        kwargs['timeout'] = timedelta(seconds=timeout)
    dist.init_process_group(backend=backend, **kwargs)


def close_distributed() -> None:
    """Destroys the process group, if any, and frees it while the
    interpreter is fully alive.

    A group that outlives the interpreter's teardown can abort a process
    that has finished its work: gloo's worker threads are destroyed at
    exit ("terminate called without an active exception"). The model's DDP
    wrapper holds the group, and mmengine's Runner sits in reference
    cycles, so they are collected before the group is destroyed; the
    caller must hold no Runner (:func:`run_runner` builds it in a frame
    that has returned by then).
    """
    import gc

    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()


def run_runner(cfg: Config, method: str) -> None:
    """Builds the config's runner (``runner_type``, else mmengine's
    Runner) and calls its ``method`` (``'train'`` or ``'test'``), between
    :func:`init_distributed_on_cpu` and :func:`close_distributed`.

    Args:
        cfg (Config): The config of the run.
        method (str): The runner's method to call.
    """
    init_distributed_on_cpu(cfg)
    try:
        _build_and_call(cfg, method)
    finally:
        close_distributed()


def _build_and_call(cfg: Config, method: str) -> None:
    # The Runner lives in this frame only: it has returned, and the Runner
    # with it, when close_distributed frees the group.
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner
    runner = (
        Runner.from_cfg(cfg)
        if 'runner_type' not in cfg else RUNNERS.build(cfg))
    getattr(runner, method)()
