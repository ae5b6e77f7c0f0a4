# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Turn a training checkpoint into a release checkpoint (OpenMMLab style).

A training checkpoint of mmengine holds the optimizer, the schedulers and the
MessageHub logs besides the weights. A release keeps only ``meta`` and
``state_dict`` (and, on request, mmengine's ``ema_state_dict``), and is named
``<out>-<first 8 hex digits of its sha256>.pth`` like mmdet's model zoo, so
that the name pins the exact bytes a metafile's ``Weights`` URL points to.

Two bugs of the tools this follows are avoided on purpose: the hash is the
one of the *published* file (mmseg's ``publish_model.py`` hashes the input),
and the ``.pth`` suffix is removed as a suffix (``str.rstrip('.pth')`` strips
any trailing ``.``, ``p``, ``t`` and ``h`` characters, e.g. ``depth.pth`` ->
``de``).
"""
import hashlib
import os
import os.path as osp
import tempfile
from collections import OrderedDict
from typing import Any, Dict, List, Tuple

import torch

from ..torch_compat import WEIGHTS_ONLY_ALLOW_LIST
from ..utils.checkpoint_loading import (CheckpointError, CheckpointFileError,
                                        load_checkpoint)
from ..utils.cli import default_file_mode, make_parent_dir

#: The keys a published checkpoint keeps (mmdet's ``save_keys`` default).
RELEASE_KEYS = ('meta', 'state_dict')
#: The key of mmengine's ``EMAHook`` averaged-model weights.
EMA_KEY = 'ema_state_dict'

# Types ``torch.load(weights_only=True)`` accepts without any allow-list.
_PLAIN_TYPES = (str, int, float, bool, type(None), bytes, torch.Tensor,
                torch.dtype, torch.device, torch.Size)


class CheckpointPublishError(ValueError):
    """A file that cannot be published, with the reason and the file."""


def sha256sum(path: str, chunk_size: int = 1 << 20) -> str:
    """The hex sha256 digest of the file at ``path``."""
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        for chunk in iter(lambda: f.read(chunk_size), b''):
            digest.update(chunk)
    return digest.hexdigest()


def release_name(out_file: str, sha256: str) -> str:
    """``out_file`` with its ``.pth`` suffix (if any) replaced by
    ``-<sha256[:8]>.pth``.

    Examples:
        >>> release_name('work/faster_depth.pth', 'abcdef0123')
        'work/faster_depth-abcdef01.pth'
        >>> release_name('work/model', 'abcdef0123')
        'work/model-abcdef01.pth'
    """
    stem = out_file[:-len('.pth')] if out_file.endswith('.pth') else out_file
    return f'{stem}-{sha256[:8]}.pth'


def _check_plain(value: Any, path: str) -> None:
    """Raises if ``value`` holds anything that ``weights_only=True`` would
    refuse without an allow-list; ``path`` names the key in the message."""
    if isinstance(value, (dict, OrderedDict)):
        for key, item in value.items():
            if not isinstance(key, (str, int)):
                raise CheckpointPublishError(
                    f'{path} has a key of type {type(key).__name__} '
                    f'({key!r}); a published checkpoint must load with '
                    'torch.load(weights_only=True)')
            _check_plain(item, f'{path}.{key}')
    elif isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        for i, item in enumerate(value):
            _check_plain(item, f'{path}[{i}]')
    elif not isinstance(value, _PLAIN_TYPES):
        raise CheckpointPublishError(
            f'{path} is a {type(value).__module__}.{type(value).__name__}, '
            'which torch.load(weights_only=True) refuses; remove it from '
            'the checkpoint before publishing')


def load_training_checkpoint(in_file: str) -> dict:
    """Loads an mmengine checkpoint with ``weights_only=True`` (mmengine's
    logging types allow-listed, see :mod:`kcla_mm.utils.checkpoint_safety`);
    on torch < 2.6, which has no allow-list, as mmengine loads it there
    (:func:`kcla_mm.utils.checkpoint_loading.load_checkpoint`).

    Raises:
        CheckpointPublishError: ``in_file`` is missing, is not a PyTorch
            file, holds NaN or Inf tensors, or is not a dict with a
            ``state_dict`` of tensors.
    """
    try:
        checkpoint = load_checkpoint(in_file)
    except CheckpointFileError as exc:
        if exc.missing:
            raise CheckpointPublishError(str(exc)) from None
        loader = ('weights_only=True'
                  if WEIGHTS_ONLY_ALLOW_LIST else 'torch.load')
        raise CheckpointPublishError(
            f'{in_file} is not a PyTorch checkpoint that loads with {loader} '
            f'({exc.detail})') from None
    except CheckpointError as exc:  # non-finite tensors
        raise CheckpointPublishError(str(exc)) from None
    if not isinstance(checkpoint, dict) or 'state_dict' not in checkpoint:
        found = (
            sorted(map(str, checkpoint))
            if isinstance(checkpoint, dict) else type(checkpoint).__name__)
        raise CheckpointPublishError(
            f'{in_file} is not an mmengine checkpoint: expected a dict with '
            f"a 'state_dict' key, found {found}")
    state_dict = checkpoint['state_dict']
    if not isinstance(state_dict, dict) or not state_dict or not all(
            isinstance(v, torch.Tensor) for v in state_dict.values()):
        raise CheckpointPublishError(
            f"{in_file}: 'state_dict' is not a non-empty dict of tensors")
    return checkpoint


def strip_checkpoint(checkpoint: dict,
                     keep_ema: bool = False,
                     source: str = 'checkpoint') -> Tuple[dict, List[str]]:
    """The release part of a training checkpoint.

    Args:
        checkpoint (dict): A loaded mmengine checkpoint.
        keep_ema (bool): Also keep ``ema_state_dict``. With mmengine's
            ``EMAHook`` the ``state_dict`` already holds the averaged
            weights; ``ema_state_dict`` then holds the raw ones. Defaults
            to False.
        source (str): Names the checkpoint in error messages.

    Returns:
        tuple[dict, list[str]]: The release checkpoint (``meta`` is ``{}``
        when the input had none) and the keys that were dropped.
    """
    keep = RELEASE_KEYS + ((EMA_KEY, ) if keep_ema else ())
    if keep_ema and EMA_KEY not in checkpoint:
        raise CheckpointPublishError(
            f'{source} has no {EMA_KEY!r} (it was not trained with '
            "mmengine's EMAHook): there are no EMA weights to keep")
    released = {key: checkpoint[key] for key in keep if key in checkpoint}
    released.setdefault('meta', {})
    for key, value in released.items():
        _check_plain(value, f'{source}[{key!r}]')
    dropped = [str(key) for key in checkpoint if key not in keep]
    return released, dropped


def publish_checkpoint(in_file: str,
                       out_file: str,
                       keep_ema: bool = False) -> Dict[str, Any]:
    """Writes the release checkpoint of ``in_file`` to
    ``<out_file>-<sha256[:8]>.pth``.

    The file is written under a temporary name in the output folder
    (created if missing), hashed, then renamed, so a failed run leaves no
    half-written release. It gets the permissions a plain ``open()`` gives
    (``0o666`` less the umask), and its bytes, hence its name, depend only
    on the released content: torch names the records inside the archive
    after the file it saves to, so it saves to an open file object (records
    ``archive/...``), not to the temporary file's random name.

    Args:
        in_file (str): A training (or any mmengine) checkpoint.
        out_file (str): Output path; ``.pth`` is optional.
        keep_ema (bool): Also keep ``ema_state_dict``. Defaults to False.

    Returns:
        dict: ``path`` (the published file), ``sha256``, ``kept`` and
        ``dropped`` (key lists).
    """
    checkpoint = load_training_checkpoint(in_file)
    released, dropped = strip_checkpoint(checkpoint, keep_ema, in_file)
    out_dir = make_parent_dir(out_file)
    fd, tmp_path = tempfile.mkstemp(suffix='.pth.tmp', dir=out_dir)
    try:
        with os.fdopen(fd, 'wb') as f:
            torch.save(released, f)
        os.chmod(tmp_path, default_file_mode())
        digest = sha256sum(tmp_path)
        final = release_name(out_file, digest)
        os.replace(tmp_path, final)
    except BaseException:
        if osp.exists(tmp_path):
            os.remove(tmp_path)
        raise
    return dict(
        path=final, sha256=digest, kept=sorted(released), dropped=dropped)
