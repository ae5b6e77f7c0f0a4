# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Config adjustments shared by tools/train.py and tools/test.py."""
import argparse
import os
import os.path as osp
from typing import Iterator, Optional, Tuple

import torch
from mmengine.config import Config, ConfigDict, DictAction

# init_cfg checkpoints that mmengine fetches itself (not local files).
_REMOTE_PREFIXES = ('http://', 'https://', 'torchvision://', 'open-mmlab://',
                    'mmcls://', 'pavi://', 's3://', 'modelzoo://')


def _walk(node, path: str) -> Iterator[Tuple[str, dict]]:
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from _walk(value, f'{path}.{key}' if path else key)
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from _walk(value, f'{path}.{i}')


def check_pretrained_files(cfg: Config) -> None:
    """Fails before any data is loaded when an ``init_cfg`` of type
    ``Pretrained`` points to a local file that does not exist."""
    for path, node in _walk(cfg.get('model', {}), 'model'):
        if node.get('type') != 'Pretrained' or not node.get('checkpoint'):
            continue
        checkpoint = str(node['checkpoint'])
        if checkpoint.startswith(_REMOTE_PREFIXES) or osp.isfile(checkpoint):
            continue
        raise FileNotFoundError(
            f"{path}.checkpoint='{checkpoint}' does not exist (looked in "
            f"{osp.abspath(checkpoint)}). Convert the official KCLA ImageNet "
            'checkpoint with tools/model_converters/kcla_official2mm.py and '
            'put it there, or override the path with --cfg-options '
            f'{path}.checkpoint=PATH (or {path}=None to train from scratch).')


def _datasets(dataloader_cfg) -> Iterator[ConfigDict]:
    """The dataset config and any datasets wrapped inside it."""
    stack = [dataloader_cfg.get('dataset')]
    while stack:
        dataset = stack.pop()
        if isinstance(dataset, dict):
            yield dataset
            stack.append(dataset.get('dataset'))
            stack.extend(dataset.get('datasets') or [])


def set_data_root(cfg: Config, data_root: str) -> None:
    """Points every dataset (and evaluator annotation file) of ``cfg`` at
    ``data_root``.

    ``--cfg-options data_root=X`` alone would not do this: the configs'
    ``data_root`` variable has already been substituted into the dataloaders
    when the config was read.
    """
    old_root = cfg.get('data_root')
    data_root = data_root if data_root.endswith('/') else data_root + '/'
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        if cfg.get(loader):
            for dataset in _datasets(cfg[loader]):
                if 'data_root' in dataset:
                    dataset.data_root = data_root
    for evaluator in ('val_evaluator', 'test_evaluator'):
        metrics = cfg.get(evaluator)
        if not metrics:
            continue
        for metric in metrics if isinstance(metrics, list) else [metrics]:
            ann_file = metric.get('ann_file')
            if ann_file and old_root and ann_file.startswith(old_root):
                metric.ann_file = data_root + ann_file[len(old_root):]
    cfg.data_root = data_root


def cpu_distributed_defaults(cfg: Config) -> None:
    """Lets the same config train distributed on a CPU-only machine.

    The configs ask for NCCL, which needs GPUs: use gloo instead (an
    explicit ``env_cfg.dist_cfg.backend`` other than nccl is kept). mmengine
    wraps the model in DDP with ``device_ids=[LOCAL_RANK]``, which DDP
    refuses for CPU modules: ask for ``device_ids=None``.
    """
    if torch.cuda.is_available():
        return
    dist_cfg = cfg.setdefault('env_cfg', ConfigDict()).setdefault(
        'dist_cfg', ConfigDict())
    if dist_cfg.get('backend', 'nccl') == 'nccl':
        dist_cfg.backend = 'gloo'
    wrapper = cfg.get('model_wrapper_cfg') or ConfigDict(
        type='MMDistributedDataParallel')
    wrapper.setdefault('device_ids', None)
    cfg.model_wrapper_cfg = wrapper


def init_distributed_on_cpu(cfg: Config) -> None:
    """Starts the process group for ``--launcher pytorch`` without GPUs.

    mmengine 0.10.7's pytorch launcher calls ``torch.cuda.set_device``
    before ``init_process_group``, which fails on a CPU-only torch; once a
    group exists, the Runner uses it as it is.
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


def load_config(path: str, cfg_options: Optional[dict], launcher: str,
                work_dir: Optional[str]) -> Config:
    """Reads a config the way tools/train.py and tools/test.py need it:
    ``--cfg-options`` merged (``data_root`` re-pointing every dataset),
    ``work_dir`` defaulting to work_dirs/<config name>, gloo without GPUs.
    """
    cfg = Config.fromfile(path)
    cfg.launcher = launcher
    options = dict(cfg_options or {})
    data_root = options.pop('data_root', None)
    if options:
        cfg.merge_from_dict(options)
    if data_root is not None:
        set_data_root(cfg, data_root)
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('./work_dirs',
                                osp.splitext(osp.basename(path))[0])
    cpu_distributed_defaults(cfg)
    return cfg


def add_runner_arguments(parser: argparse.ArgumentParser) -> None:
    """The options tools/train.py and tools/test.py share with mmdet's."""
    parser.add_argument(
        '--cfg-options', nargs='+', action=DictAction,
        help='override config settings, KEY=VALUE; data_root=PATH re-points '
        'every dataset')
    parser.add_argument(
        '--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
        default='none', help='job launcher')
    # torch.distributed.launch passes --local-rank (torchrun sets LOCAL_RANK)
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)


def export_local_rank(args: argparse.Namespace) -> None:
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))


def close_distributed() -> None:
    """Destroys the process group, if any, before the interpreter exits:
    a gloo group left alive can abort the process at exit ("terminate
    called without an active exception") after a successful run."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
