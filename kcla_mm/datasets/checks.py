# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Checking the data a config reads, before a run does (the library of
tools/misc/check_dataset.py).

A faulty sample otherwise shows late or never: a validation mask of the
wrong size crashes at the first validation without a file name, a training
mask of the wrong size is silently stretched by ``Resize``, mask values
outside the label set silently change the metrics, a COCO box outside its
image or of zero size is silently dropped by mmdet, an empty split fails
with numpy's "need at least one array to concatenate".

:func:`check_config` builds every dataset of the config's dataloaders
(through the wrappers: ``dataset``, ``datasets``) in the config's default
scope and checks each sample's files:

* every dataset: at least one sample; each image present and readable;
* segmentation (mmseg datasets): each mask present, readable, one channel,
  of its image's size, with values in the dataset's label set (``range(
  num_classes)``, shifted by one with ``reduce_zero_label``, the old ids of
  a ``label_map``) or its ``ignore_index``; and, over a split with plain
  labels, some mask holding a label other than 0 where masks hold the
  ignore index (raw 0/255 masks, never converted, would be all ignored);
* detection (mmdet datasets): with a COCO-style ``ann_file``, every image it
  lists present, readable and of the size it states, every annotation's
  image and category known, every box finite, of positive size and inside
  its image (:data:`BOX_TOLERANCE`), every class of the config's
  ``metainfo`` a category of the file; other mmdet datasets: the boxes of
  the loaded instances inside their images.

Every problem is collected (a :class:`Problem` names the file), none
stops the scan.
"""
import contextlib
import io
import json
import math
import os.path as osp
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterator, List, Optional, Sequence, Set, Tuple

import mmcv
import numpy as np
from mmengine import fileio
from mmengine.config import Config, ConfigDict
from mmengine.dataset import BaseDataset

LOADERS = ('train', 'val', 'test')
# How far (pixels) a box may reach past its image's border: COCO's boxes
# come from polygons and carry float rounding.
BOX_TOLERANCE = 1.0


class DatasetCheckError(RuntimeError):
    """The config's data cannot be checked at all (not a data problem)."""


@dataclass
class Problem:
    """One faulty file (or setting) and what is wrong with it."""
    path: str
    message: str

    def __str__(self) -> str:
        return f'{self.path}: {self.message}'


@dataclass
class SplitReport:
    """What :func:`check_config` found in one dataset of a dataloader.

    Attributes:
        key (str): Where the dataset is in the config, e.g.
            ``'val_dataloader.dataset'``.
        description (str): Its type and the files it reads.
        samples (int): Its number of samples (0 when it could not load).
        problems (list[Problem]): Everything found wrong.
        same_as (str, optional): The key of an identical dataset checked
            before; then nothing was checked again.
    """
    key: str
    description: str = ''
    samples: int = 0
    problems: List[Problem] = field(default_factory=list)
    same_as: Optional[str] = None
    unit: str = 'samples'

    def format(self) -> str:
        if self.same_as:
            return f'{self.key}: the same data as {self.same_as}'
        head = (f'{self.key} ({self.description}): {self.samples} '
                f'{self.unit}')
        if not self.problems:
            return head + ', ok'
        lines = [f'{head}, {len(self.problems)} problem(s):']
        lines += [f'  {problem}' for problem in self.problems]
        return '\n'.join(lines)


# --------------------------------------------------------------------------
# the datasets of a config


def dataset_configs(
        cfg: Config,
        loaders: Sequence[str] = LOADERS) -> List[Tuple[str, ConfigDict]]:
    """The leaf datasets of the config's ``{loader}_dataloader`` for each
    of ``loaders``, with their config keys; wrappers (``RepeatDataset``,
    ``ConcatDataset``, ``ClassBalancedDataset``, ``MultiImageMixDataset``
    ...) are walked through their ``dataset`` / ``datasets``."""
    found = []

    def walk(node, key):
        if not isinstance(node, dict):
            return
        if isinstance(node.get('dataset'), dict):
            walk(node['dataset'], f'{key}.dataset')
        elif isinstance(node.get('datasets'), (list, tuple)):
            for i, child in enumerate(node['datasets']):
                walk(child, f'{key}.datasets.{i}')
        else:
            found.append((key, node))

    for loader in loaders:
        loader_cfg = cfg.get(f'{loader}_dataloader')
        if loader_cfg and loader_cfg.get('dataset') is not None:
            walk(loader_cfg['dataset'], f'{loader}_dataloader.dataset')
    return found


def _describe_cfg(dataset_cfg: dict) -> str:
    kind = dataset_cfg.get('type')
    kind = getattr(kind, '__name__', kind)
    parts = [str(kind)]
    for name in ('data_root', 'ann_file', 'data_prefix'):
        if dataset_cfg.get(name):
            parts.append(f'{name}={dataset_cfg[name]}')
    return ', '.join(parts)


def _describe(dataset) -> str:
    parts = [type(dataset).__name__]
    if getattr(dataset, 'ann_file', None):
        parts.append(f'ann_file {dataset.ann_file}')
    for name, path in (getattr(dataset, 'data_prefix', None) or {}).items():
        if path:
            parts.append(f'{name} {path}')
    return ', '.join(parts)


def _import_scope(scope: str) -> None:
    """Imports the registries of ``scope`` (mmdet, mmseg, mmpretrain)."""
    from mmengine.registry import init_default_scope
    if scope != 'mmengine':
        import importlib
        import importlib.util
        if importlib.util.find_spec(scope) is None:
            raise DatasetCheckError(
                f"the config's default_scope is {scope!r}, but {scope} is not "
                'installed: its datasets cannot be built here (install it, '
                'e.g. the pretrain extra for mmpretrain)')
        importlib.import_module(f'{scope}.registry')
    init_default_scope(scope)


# --------------------------------------------------------------------------
# reading files


def _read(path: str, backend_args: Optional[dict], flag: str, backend: str,
          what: str) -> Tuple[Optional[np.ndarray], Optional[Problem]]:
    """The decoded file, or the problem that stops reading it."""
    try:
        exists = fileio.exists(path, backend_args=backend_args)
    except Exception as exc:  # a remote backend that cannot answer
        return None, Problem(path, f'{what} cannot be reached ({exc})')
    if not exists:
        return None, Problem(path, f'{what} missing')
    try:
        array = mmcv.imfrombytes(
            fileio.get(path, backend_args=backend_args),
            flag=flag,
            backend=backend)
    except Exception as exc:
        return None, Problem(path, f'{what} unreadable ({exc})')
    if array is None or array.size == 0:
        return None, Problem(path, f'{what} unreadable (not an image)')
    return array, None


def _image_size(
        path: str, backend_args: Optional[dict], header_only: bool
) -> Tuple[Optional[Tuple[int, int]], Optional[Problem]]:
    """(width, height) of an image, as mmcv's ``LoadImageFromFile``
    decodes it (cv2), or from its header alone with ``header_only``."""
    if not header_only:
        image, problem = _read(path, backend_args, 'color', 'cv2', 'image')
        return (None if image is None else
                (image.shape[1], image.shape[0])), problem
    from PIL import Image
    try:
        if not fileio.exists(path, backend_args=backend_args):
            return None, Problem(path, 'image missing')
        with fileio.get_local_path(
                path, backend_args=backend_args) as local, Image.open(
                    local) as image:
            return image.size, None
    except Exception as exc:
        return None, Problem(path, f'image unreadable ({exc})')


def _run(fn: Callable, items: Sequence, jobs: int) -> Iterator:
    """``map(fn, items)``, in ``jobs`` threads (decoding releases the GIL),
    in order."""
    if jobs <= 1 or len(items) < 2:
        return map(fn, items)
    pool = ThreadPoolExecutor(jobs)
    try:
        return iter(list(pool.map(fn, items)))
    finally:
        pool.shutdown()


# --------------------------------------------------------------------------
# segmentation


def seg_label_values(dataset) -> Tuple[List[int], int]:
    """The mask values an mmseg dataset's ``LoadAnnotations`` turns into
    classes, and its ignore index.

    ``range(num_classes)``; with ``reduce_zero_label`` 0 (ignored) and
    ``1 .. num_classes``; with a ``label_map`` (a ``metainfo`` with fewer
    classes than the dataset's) the old ids it maps.
    """
    label_map = getattr(dataset, 'label_map', None)
    if label_map:
        values = sorted(int(k) for k in label_map)
    else:
        values = list(range(len(dataset.metainfo['classes'])))
    if getattr(dataset, 'reduce_zero_label', False):
        values = [0] + [v + 1 for v in values]
    return values, int(getattr(dataset, 'ignore_index', 255))


def _value_ranges(values: Sequence[int]) -> str:
    """'0-2, 5' for [0, 1, 2, 5]."""
    parts, start = [], None
    for i, v in enumerate(values):
        if start is None:
            start = v
        if i + 1 == len(values) or values[i + 1] != v + 1:
            parts.append(str(v) if v == start else f'{start}-{v}')
            start = None
    return ', '.join(parts)


def check_seg_sample(info: dict, allowed: Sequence[int], ignore_index: int,
                     backend_args: Optional[dict],
                     header_only: bool) -> Tuple[List[Problem], Set[int]]:
    """The problems of one mmseg sample (image and mask), and the values
    its mask holds (none where it could not be read)."""
    problems = []
    size, problem = _image_size(info['img_path'], backend_args, header_only)
    if problem:
        problems.append(problem)
    mask_path = info.get('seg_map_path')
    if not mask_path:
        return problems, set()
    # what mmseg's LoadAnnotations reads (imdecode_backend='pillow')
    mask, problem = _read(mask_path, backend_args, 'unchanged', 'pillow',
                          'mask')
    if problem:
        problems.append(problem)
        return problems, set()
    mask = mask.squeeze()
    if mask.ndim != 2:
        problems.append(
            Problem(
                mask_path, f'mask has {mask.shape[-1]} channels, a label mask '
                'has one (a value per pixel)'))
        return problems, set()
    if size is not None and (mask.shape[1], mask.shape[0]) != tuple(size):
        problems.append(
            Problem(
                mask_path, f'mask is {mask.shape[1]}x{mask.shape[0]}, its '
                f'image {info["img_path"]} is {size[0]}x{size[1]} (WxH)'))
    values, counts = np.unique(mask, return_counts=True)
    valid = set(allowed) | {ignore_index}
    bad = [(int(v), int(n)) for v, n in zip(values, counts)
           if int(v) not in valid]
    if bad:
        shown = ', '.join(f'{v} ({n} pixels)' for v, n in bad[:8])
        more = f' and {len(bad) - 8} more' if len(bad) > 8 else ''
        problems.append(
            Problem(
                mask_path, f'mask values {shown}{more} outside the label set '
                f'{_value_ranges(list(allowed))} and the ignore index '
                f'{ignore_index}'))
    return problems, {int(v) for v in values}


def check_seg_dataset(dataset,
                      header_only: bool = False,
                      jobs: int = 1) -> List[Problem]:
    """The problems of every sample of a (fully initialised) mmseg
    dataset."""
    allowed, ignore_index = seg_label_values(dataset)
    backend_args = getattr(dataset, 'backend_args', None)
    infos = [dataset.get_data_info(i) for i in range(len(dataset))]
    problems, seen = [], set()
    for found, values in _run(
            lambda info: check_seg_sample(info, allowed, ignore_index,
                                          backend_args, header_only), infos,
            jobs):
        problems += found
        seen |= values
    problem = _unconverted_masks(dataset, infos, allowed, ignore_index, seen)
    return problems + ([problem] if problem else [])


def _unconverted_masks(dataset, infos: Sequence[dict], allowed: Sequence[int],
                       ignore_index: int, seen: Set[int]) -> Optional[Problem]:
    """A split whose masks hold background and the ignore index but no
    other label: raw 0/255 masks (ISIC's, Kvasir-SEG's) that were not
    converted to 0/1, on which a run would learn and score background
    only, every object pixel ignored. Checked where the labels are plain
    (0 .. K-1: no ``reduce_zero_label``, no ``label_map``)."""
    plain = (not getattr(dataset, 'reduce_zero_label', False)
             and not dataset.metainfo.get('label_map')
             and list(allowed) == list(range(len(allowed))))
    if (not plain or len(allowed) < 2 or ignore_index not in seen
            or seen & set(allowed[1:])):
        return None
    masks = [
        info['seg_map_path'] for info in infos if info.get('seg_map_path')
    ]
    folder = osp.dirname(masks[0]) if masks else str(dataset.data_root)
    return Problem(
        folder, f'no mask holds a label other than 0 but masks hold '
        f'{ignore_index}, the ignore index: raw 0/{ignore_index} masks not '
        'converted to 0/1? A run would ignore every object pixel (convert '
        'them with tools/dataset_converters/prepare_isic.py or '
        'prepare_kvasir.py)')


# --------------------------------------------------------------------------
# detection


def _box_problem(box: Sequence[float], width: float,
                 height: float) -> Optional[str]:
    """What is wrong with an (x, y, w, h) box in a width x height image."""
    try:
        x, y, w, h = (float(v) for v in box)
    except (TypeError, ValueError):
        return f'bbox {box} is not 4 numbers'
    if not all(math.isfinite(v) for v in (x, y, w, h)):
        return f'bbox {list(box)} is not finite'
    if w <= 0 or h <= 0:
        return f'bbox {list(box)} has no area (w or h <= 0)'
    tol = BOX_TOLERANCE
    if x < -tol or y < -tol or x + w > width + tol or y + h > height + tol:
        return (f'bbox {list(box)} (x, y, w, h) reaches outside the '
                f'{width:g}x{height:g} image')
    return None


def _load_coco(ann_file: str, backend_args: Optional[dict]) -> Optional[dict]:
    """The annotation file as a dict when it is COCO-style json, else
    None."""
    if not str(ann_file).endswith('.json'):
        return None
    with fileio.get_local_path(ann_file, backend_args=backend_args) as local:
        with open(local) as f:
            coco = json.load(f)
    if not isinstance(coco, dict) or 'images' not in coco:
        return None
    return coco


def check_coco(dataset,
               coco: dict,
               header_only: bool = False,
               jobs: int = 1) -> List[Problem]:
    """The problems of a COCO-style annotation file and the images it
    lists (all of them, also those the dataset filters out)."""
    ann_file = dataset.ann_file
    backend_args = getattr(dataset, 'backend_args', None)
    img_prefix = dataset.data_prefix.get('img', '') or dataset.data_prefix.get(
        'img_path', '')
    problems = []
    images = {}
    for entry in coco.get('images', []):
        missing = [
            k for k in ('id', 'file_name', 'width', 'height') if k not in entry
        ]
        if missing:
            problems.append(
                Problem(
                    ann_file, f'image entry {entry.get("id", entry)} has no '
                    f'{", ".join(missing)}'))
            continue
        images[entry['id']] = entry

    def check_image(entry):
        path = osp.join(img_prefix, entry['file_name'])
        size, problem = _image_size(path, backend_args, header_only)
        if problem:
            return [
                Problem(
                    problem.path,
                    f'{problem.message} (image id {entry["id"]} of '
                    f'{ann_file})')
            ]
        if tuple(size) != (entry['width'], entry['height']):
            return [
                Problem(
                    path, f'image is {size[0]}x{size[1]}, {ann_file} says '
                    f'{entry["width"]}x{entry["height"]} (image id '
                    f'{entry["id"]})')
            ]
        return []

    for found in _run(check_image, list(images.values()), jobs):
        problems.extend(found)

    categories = {
        c.get('id'): c.get('name')
        for c in coco.get('categories', [])
    }
    names = set(categories.values())
    for name in dataset.metainfo.get('classes') or ():
        if name not in names:
            problems.append(
                Problem(
                    ann_file, f"class {name!r} of the dataset's metainfo is "
                    'not a category of the file (its boxes are never '
                    'loaded); the categories: ' +
                    ', '.join(str(n) for n in categories.values())))
    for ann in coco.get('annotations', []):
        ann_id = ann.get('id')
        image = images.get(ann.get('image_id'))
        if image is None:
            problems.append(
                Problem(
                    ann_file, f'annotation id {ann_id}: image_id '
                    f'{ann.get("image_id")} is not among the images'))
            continue
        path = osp.join(img_prefix, image['file_name'])
        if ann.get('category_id') not in categories:
            problems.append(
                Problem(
                    path, f'annotation id {ann_id}: category_id '
                    f'{ann.get("category_id")} is not among the categories '
                    f'of {ann_file}'))
        problem = _box_problem(
            ann.get('bbox'), image['width'], image['height'])
        if problem:
            problems.append(
                Problem(path, f'annotation id {ann_id}: {problem}'))
    return problems


def check_det_sample(info: dict, backend_args: Optional[dict],
                     header_only: bool) -> List[Problem]:
    """The problems of one loaded mmdet sample (image, its stated size,
    its instances' boxes)."""
    path = info['img_path']
    size, problem = _image_size(path, backend_args, header_only)
    if problem:
        return [problem]
    problems = []
    stated = (info.get('width'), info.get('height'))
    if None not in stated and tuple(size) != stated:
        problems.append(
            Problem(
                path, f'image is {size[0]}x{size[1]}, its annotation says '
                f'{stated[0]}x{stated[1]}'))
    for i, instance in enumerate(info.get('instances') or []):
        box = instance.get('bbox')
        if box is None or len(box) != 4:
            problems.append(Problem(path, f'instance {i}: bbox {box}'))
            continue
        x1, y1, x2, y2 = box
        problem = _box_problem([x1, y1, x2 - x1, y2 - y1], *size)
        if problem:
            problems.append(Problem(path, f'instance {i}: {problem}'))
    return problems


def check_det_dataset(dataset,
                      header_only: bool = False,
                      jobs: int = 1) -> List[Problem]:
    """The problems of a (fully initialised) mmdet dataset: from its
    COCO-style annotation file when it has one, else from its samples."""
    backend_args = getattr(dataset, 'backend_args', None)
    coco = None
    if getattr(dataset, 'ann_file', None):
        try:
            coco = _load_coco(dataset.ann_file, backend_args)
        except Exception as exc:
            return [Problem(dataset.ann_file, f'unreadable ({exc})')]
    if coco is not None:
        return check_coco(dataset, coco, header_only, jobs)
    infos = [dataset.get_data_info(i) for i in range(len(dataset))]
    return [
        p for found in _run(
            lambda info: check_det_sample(info, backend_args, header_only),
            infos, jobs) for p in found
    ]


# --------------------------------------------------------------------------
# any dataset


def check_image_dataset(dataset,
                        header_only: bool = False,
                        jobs: int = 1) -> List[Problem]:
    """The images (``img_path``) of any other dataset, e.g. mmpretrain's."""
    backend_args = getattr(dataset, 'backend_args', None)
    infos = [dataset.get_data_info(i) for i in range(len(dataset))]

    def check(info):
        if not info.get('img_path'):
            return []
        return [
            p for p in _image_size(info['img_path'], backend_args, header_only)
            [1:] if p
        ]

    return [p for found in _run(check, infos, jobs) for p in found]


def _checker(dataset) -> Callable:
    try:
        from mmseg.datasets import BaseSegDataset
        if isinstance(dataset, BaseSegDataset):
            return check_seg_dataset
    except ImportError:
        pass
    try:
        from mmdet.datasets import BaseDetDataset
        if isinstance(dataset, BaseDetDataset):
            return check_det_dataset
    except ImportError:
        pass
    return check_image_dataset


def check_dataset_cfg(key: str,
                      dataset_cfg: dict,
                      header_only: bool = False,
                      jobs: int = 1) -> SplitReport:
    """Builds one dataset (without its pipeline) and checks it.

    A dataset that cannot load (a missing folder or annotation file, an
    empty split) is reported as a problem of the split, with the error.
    """
    from mmengine.registry import DATASETS
    report = SplitReport(key, _describe_cfg(dataset_cfg))
    cfg = ConfigDict(dataset_cfg)
    cfg.pipeline = []  # the transforms are not data
    cfg.lazy_init = True
    dataset_type = cfg.get('type')
    if isinstance(dataset_type, str):  # found as DATASETS.build finds it
        with DATASETS.switch_scope_and_registry(
                cfg.get('_scope_')) as registry:
            dataset_type = registry.get(dataset_type)
    if isinstance(dataset_type, type) and issubclass(dataset_type,
                                                     BaseDataset):
        # mmengine's serialisation fails on an empty split with numpy's
        # "need at least one array to concatenate"
        cfg.serialize_data = False
    where = cfg.get('ann_file') or next(
        (p for p in (cfg.get('data_prefix') or {}).values() if p), '')
    if cfg.get('data_root') and not osp.isabs(str(where)):
        where = osp.join(cfg.data_root, str(where))
    where = where or key
    try:
        dataset = DATASETS.build(cfg)
        report.description = _describe(dataset)
        # pycocotools prints its progress; the report is the output
        with contextlib.redirect_stdout(io.StringIO()):
            dataset.full_init()
    except Exception as exc:
        report.problems.append(
            Problem(
                str(where), f'the dataset does not load: '
                f'{type(exc).__name__}: {exc}'))
        return report
    report.samples = len(dataset)
    if report.samples == 0:
        report.problems.append(
            Problem(
                str(where), 'empty split: no sample (check data_root, '
                'data_prefix, ann_file and filter_cfg)'))
    # also when empty: a COCO file's own problems may tell why
    report.problems.extend(_checker(dataset)(dataset, header_only, jobs))
    return report


def check_config(cfg: Config,
                 loaders: Sequence[str] = LOADERS,
                 header_only: bool = False,
                 jobs: int = 1) -> Iterator[SplitReport]:
    """Checks every dataset that the config's dataloaders read.

    Args:
        cfg (Config): The config (``data_root`` already re-pointed, see
            :func:`kcla_mm.utils.config.load_config`).
        loaders (sequence of str): Which of ``train``, ``val``, ``test``.
        header_only (bool): Read only the images' headers (their size),
            not decode them: much faster, but a truncated image passes.
            Masks are always decoded (their values are checked).
        jobs (int): Threads that read files.

    Yields:
        SplitReport: One per dataset, as it is checked; then one for the
        evaluators' annotation files (key ``'evaluators'``) when a config
        names any.

    Raises:
        DatasetCheckError: The config has no dataloader of ``loaders``, or
            its default scope's package is not installed.
    """
    import kcla_mm  # noqa: F401  registers the medical datasets
    datasets = dataset_configs(cfg, loaders)
    if not datasets:
        raise DatasetCheckError('no dataset in ' +
                                ', '.join(f'{loader}_dataloader'
                                          for loader in loaders))
    _import_scope(cfg.get('default_scope') or 'mmengine')
    seen = {}
    for key, dataset_cfg in datasets:
        identity = repr(ConfigDict(dataset_cfg).to_dict())
        if identity in seen:
            yield SplitReport(key, same_as=seen[identity])
            continue
        seen[identity] = key
        yield check_dataset_cfg(key, dataset_cfg, header_only, jobs)
    evaluators = SplitReport(
        'evaluators', 'the annotation files of the metrics', unit='files')
    named = 0
    for loader in loaders:
        metrics = cfg.get(f'{loader}_evaluator')
        if not metrics or loader == 'train':
            continue
        for metric in metrics if isinstance(metrics, list) else [metrics]:
            ann_file = metric.get('ann_file') if isinstance(metric,
                                                            dict) else None
            if not ann_file:
                continue
            named += 1
            if not fileio.exists(ann_file):
                evaluators.problems.append(
                    Problem(
                        ann_file, f'missing ({loader}_evaluator.ann_file, '
                        'read when the run starts)'))
    if named:
        evaluators.samples = named
        yield evaluators


def format_summary(reports: Sequence[SplitReport], config: str) -> str:
    """The last line of the tool's report."""
    checked = [r for r in reports if not r.same_as and r.key != 'evaluators']
    problems = sum(len(r.problems) for r in reports)
    if problems:
        faulty = [r.key for r in reports if r.problems]
        return (f'{problems} problem(s) in {", ".join(faulty)} of {config}: '
                'fix them (or the config) before training')
    return (f'no problems in {config}: ' +
            ', '.join(f'{r.key} {r.samples} samples' for r in checked))
