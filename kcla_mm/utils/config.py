# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Reading a config for a run: overrides, data root, pretrained files.

What tools/train.py and tools/test.py do to a config before they hand it to
mmengine's Runner, as functions of plain values (the tools parse their
command lines themselves).
"""
import argparse
import os.path as osp
from typing import Iterator, List, Optional, Tuple

from mmengine.config import Config, ConfigDict, DictAction

from .distributed import cpu_distributed_defaults

# init_cfg checkpoints that mmengine fetches itself (not local files).
_REMOTE_PREFIXES = ('http://', 'https://', 'torchvision://', 'open-mmlab://',
                    'mmcls://', 'pavi://', 's3://', 'modelzoo://')


class PretrainedFileNotFoundError(FileNotFoundError):
    """An ``init_cfg`` of type ``Pretrained`` names a missing local file.

    Attributes:
        key (str): The config key of the ``init_cfg``, e.g.
            ``'model.backbone.init_cfg'``.
        checkpoint (str): The path it names.
    """

    def __init__(self, key: str, checkpoint: str) -> None:
        self.key = key
        self.checkpoint = checkpoint
        super().__init__(
            f"{key}.checkpoint='{checkpoint}' does not exist (looked in "
            f'{osp.abspath(checkpoint)}): put the checkpoint there, set '
            f'{key}.checkpoint to its path, or set {key} to None to train '
            'from scratch')


def _walk(node, path: str) -> Iterator[Tuple[str, dict]]:
    """Every dict in ``node`` (dicts and lists nested), with its dotted
    config key."""
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from _walk(value, f'{path}.{key}' if path else key)
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from _walk(value, f'{path}.{i}')


def is_pretrained_init(init_cfg) -> bool:
    """Whether ``init_cfg`` (one dict or a list) loads pretrained weights:
    has an entry of type ``Pretrained``."""
    cfgs = init_cfg if isinstance(init_cfg, (list, tuple)) else [init_cfg]
    return any(
        isinstance(c, dict) and c.get('type') == 'Pretrained' for c in cfgs)


def pretrained_keys(model_cfg, path: str = 'model') -> List[str]:
    """The dotted keys under ``model_cfg`` that load pretrained weights: a
    ``pretrained`` path, or an ``init_cfg`` of type ``Pretrained``."""
    found = []
    for where, node in _walk(model_cfg, path):
        if node.get('pretrained'):
            found.append(f'{where}.pretrained')
        if is_pretrained_init(node.get('init_cfg')):
            found.append(f'{where}.init_cfg')
    return found


def check_pretrained_files(cfg: Config) -> None:
    """Fails before any data is loaded when an ``init_cfg`` of type
    ``Pretrained`` points to a local file that does not exist.

    Args:
        cfg (Config): The config of a run.

    Raises:
        PretrainedFileNotFoundError: The first such ``init_cfg``; its
            ``key`` attribute names it in the config.
    """
    for path, node in _walk(cfg.get('model', {}), 'model'):
        if node.get('type') != 'Pretrained' or not node.get('checkpoint'):
            continue
        checkpoint = str(node['checkpoint'])
        if checkpoint.startswith(_REMOTE_PREFIXES) or osp.isfile(checkpoint):
            continue
        raise PretrainedFileNotFoundError(path, checkpoint)


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

    Merging ``data_root=X`` into the config alone would not do this: the
    configs' ``data_root`` variable has already been substituted into the
    dataloaders when the config was read.

    Args:
        cfg (Config): The config, changed in place.
        data_root (str): The new data root; a trailing ``/`` is added.
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


def add_cfg_options(parser: argparse.ArgumentParser) -> None:
    """The ``--cfg-options KEY=VALUE ...`` argument of the tools that load
    a config with :func:`load_config` (which reads ``data_root``)."""
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override config settings, KEY=VALUE; data_root=PATH re-points '
        'every dataset')


def load_config(path: str,
                cfg_options: Optional[dict] = None,
                launcher: str = 'none',
                work_dir: Optional[str] = None) -> Config:
    """Reads a config the way a training or test run needs it.

    Args:
        path (str): The config file.
        cfg_options (dict, optional): Overrides merged into the config; a
            ``data_root`` key re-points every dataset
            (:func:`set_data_root`).
        launcher (str): mmengine's job launcher (``'none'``,
            ``'pytorch'``, ``'slurm'`` or ``'mpi'``). Defaults to
            ``'none'``.
        work_dir (str, optional): The work dir; defaults to the config's,
            else ``./work_dirs/<config name>``.

    Returns:
        Config: The config, with gloo and CPU DDP settings on a machine
        without GPUs (:func:`~kcla_mm.utils.distributed.
        cpu_distributed_defaults`).
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
