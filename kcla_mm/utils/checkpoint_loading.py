# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Loading checkpoint files so that a bad file is refused in one line.

torch's own errors for a file that is not a usable checkpoint do not name
the file (mmengine logs it some lines earlier), fill a traceback, and on
torch >= 2.6 advise re-running with ``weights_only=False``: arbitrary code
execution, the one thing not to do with a file one cannot read. A
checkpoint with a bit-flipped tensor (NaN or Inf weights) loads without a
word, and a test then reports empty results, a resumed run trains on
``loss: nan``.

Here every such file raises :class:`CheckpointError`, whose message is one
line, ``<path>: <cause>``:

* :func:`load_checkpoint` loads a local file as mmengine does on this torch
  (``weights_only=True`` where torch has the allow-list of
  :mod:`kcla_mm.utils.checkpoint_safety`, i.e. torch >= 2.6; older torch
  has no allow-list and mmengine unpickles in full there) and refuses a
  missing file, a directory, an empty, truncated or damaged file, a file of
  another kind (JSON, an image, text, random bytes), a type that
  ``weights_only`` loading refuses, and floating tensors holding NaN or Inf
  anywhere in the checkpoint (weights, buffers, optimizer state).
* :func:`probe_checkpoint_file` makes the checks that need no unpickling
  (the file exists, is a zip archive with its central directory or a pickle
  stream), so that a tool can refuse a bad file before minutes of dataset
  loading.
* :func:`checked_checkpoint_loading` is a context manager under which
  mmengine's own checkpoint loading (``Runner.load_checkpoint``,
  ``Runner.resume``, ``Pretrained`` init, the inferencers) goes through
  :func:`load_checkpoint` for local files, and checks the tensors of what
  its other loaders (URLs, ``torchvision://``, ...) return. The checkpoint
  is loaded once.
"""
import contextlib
import functools
import os.path as osp
import pickle
import re
import zipfile
from collections.abc import Mapping
from typing import Any, Callable, Iterator, List, Optional, Tuple, Union

import torch

from ..torch_compat import WEIGHTS_ONLY_ALLOW_LIST

__all__ = [
    'CheckpointError', 'CheckpointFileError', 'NonFiniteCheckpointError',
    'load_checkpoint', 'probe_checkpoint_file', 'find_nonfinite_tensors',
    'check_finite', 'checked_checkpoint_loading', 'is_local_path',
    'without_module_prefix'
]

#: What ``weights_only`` loading admits in kcla_mm (see
#: :mod:`kcla_mm.utils.checkpoint_safety`); named when a file holds more.
ALLOWED_TYPES = ('kcla_mm admits only tensors, plain containers and the '
                 "logging types of mmengine's training checkpoints "
                 '(kcla_mm.utils.checkpoint_safety)')
# How many non-finite tensors a message names.
_NAMED_TENSORS = 5
_MAX_DETAIL = 300


class CheckpointError(ValueError):
    """A checkpoint file kcla_mm refuses; ``str()`` is ``'<path>: <cause>'``
    on one line.

    Attributes:
        path (str): The file.
        cause (str): Why it is refused.
    """

    def __init__(self, path: str, cause: str) -> None:
        self.path = str(path)
        self.cause = cause
        super().__init__(f'{self.path}: {cause}')


class CheckpointFileError(CheckpointError):
    """The file is missing, unreadable, not a PyTorch checkpoint, or holds a
    type ``weights_only`` loading refuses.

    Attributes:
        detail (str): The cause without its leading verdict (e.g. ``'JSON
            text'`` for the cause ``'not a PyTorch checkpoint (JSON
            text)'``), for callers that word the verdict themselves.
        missing (bool): There is no such file.
    """

    def __init__(self,
                 path: str,
                 cause: str,
                 detail: Optional[str] = None,
                 missing: bool = False) -> None:
        super().__init__(path, cause)
        self.detail = detail if detail is not None else cause
        self.missing = missing


class NonFiniteCheckpointError(CheckpointError):
    """Floating tensors of the checkpoint hold NaN or Inf.

    Attributes:
        keys (list[str]): Every such tensor's key, e.g.
            ``'state_dict.backbone.conv1.weight'``.
    """

    def __init__(self, path: str, cause: str, keys: List[str]) -> None:
        super().__init__(path, cause)
        self.keys = keys


def _not_a_checkpoint(path: str, detail: str) -> CheckpointFileError:
    return CheckpointFileError(path, f'not a PyTorch checkpoint ({detail})',
                               detail)


def _describe_foreign(head: bytes) -> str:
    """What a file that is neither a zip archive nor a pickle stream looks
    like, from its first bytes."""
    signatures = (
        (b'\x89PNG', 'a PNG image'),
        (b'\xff\xd8\xff', 'a JPEG image'),
        (b'GIF8', 'a GIF image'),
        (b'%PDF', 'a PDF document'),
        (b'\x1f\x8b', 'gzip-compressed data'),
        (b'BZh', 'bzip2-compressed data'),
        (b'\xfd7zXZ', 'xz-compressed data'),
        (b'\x93NUMPY', 'a numpy .npy array'),
        (b'\x89HDF', 'an HDF5 file'),
        (b'\x7fELF', 'an executable'),
    )
    for magic, kind in signatures:
        if head.startswith(magic):
            return kind
    # safetensors: an 8-byte little-endian header size, then a JSON header.
    if len(head) > 9 and head[8:10] == b'{"':
        return 'a safetensors file, which torch.load does not read'
    text = head.decode('utf-8', errors='replace').lstrip('\ufeff \t\r\n')
    readable = sum(c != '\ufffd' and (c.isprintable() or c in '\t\r\n')
                   for c in text)
    if text and readable >= 0.95 * len(text):
        if text.startswith(('{', '[')):
            return 'JSON text'
        if text.lower().startswith(('<!doctype html', '<html')):
            return 'an HTML page (an error page saved instead of a download?)'
        if text.startswith('<'):
            return 'XML or HTML text'
        if text.startswith('version https://git-lfs'):
            return 'a Git LFS pointer, not the file it points to'
        return 'text'
    return ('unknown binary data, starting with bytes ' +
            ' '.join(f'{b:02x}' for b in head[:8]))


def probe_checkpoint_file(path: str) -> None:
    """Refuses what is not a PyTorch checkpoint file without unpickling it:
    a missing path, a directory, an empty file, a zip archive without its
    central directory (truncated) or without ``data.pkl``, and a file that
    is neither a zip archive nor a pickle stream (JSON, an image, text,
    random bytes).

    Cheap (a few kB read) but not complete: a damaged archive member, a
    refused type and non-finite tensors show only when the file is loaded
    (:func:`load_checkpoint`).

    Raises:
        CheckpointFileError: The file and why.
    """
    path = str(path)
    if not osp.exists(path):
        raise CheckpointFileError(path, 'no such file', missing=True)
    if osp.isdir(path):
        raise CheckpointFileError(path, 'a directory, not a checkpoint file')
    try:
        with open(path, 'rb') as f:
            head = f.read(512)
    except OSError as exc:
        raise CheckpointFileError(
            path, f'cannot be read ({exc.strerror or exc})') from None
    if not head:
        raise _not_a_checkpoint(path, 'an empty file')
    if head.startswith(b'PK'):
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            raise _not_a_checkpoint(
                path, 'a truncated or damaged zip archive: its central '
                f'directory does not read ({exc}); was the copy or download '
                'cut short?') from None
        if not any(name == 'data.pkl' or name.endswith('/data.pkl')
                   for name in names):
            raise _not_a_checkpoint(
                path, 'a zip archive without the data.pkl of torch.save')
        return
    # torch.save's legacy format and any pickle of protocol >= 2; tar is
    # the format of torch < 0.4, which torch.load still reads.
    if head[:1] == b'\x80' or head[257:262] == b'ustar':
        return
    raise _not_a_checkpoint(path, _describe_foreign(head))


_ANSI = re.compile(r'\x1b\[[0-9;]*m')
# The weights_only advice of torch >= 2.6 (and 2.1): sentences to drop.
_ADVICE = re.compile(
    r'[^.\n]*(?:weights_only`? set to `?False|weights_only=False|'
    r'add_safe_globals|safe_globals\(|trust the source|trusted source|'
    r'file an issue|Check the documentation of torch\.load|'
    r'can still be loaded|have two options|recommended steps|'
    r'In PyTorch 2\.6)[^\n]*', re.IGNORECASE)
# The refused type: named after GLOBAL by torch 2.1's unpickler and for
# a global, after "but got <class" by torch >= 2.6 for a class it reaches
# otherwise (a numpy dtype of a scalar).
_REFUSED_GLOBAL = re.compile(
    r'(?:Unsupported global: GLOBAL|GLOBAL|Unsupported class)\s+([\w.]+)|'
    r"but got <class '([\w.]+)'>")


def _one_line(text: str) -> str:
    text = ' '.join(_ANSI.sub('', text).split())
    return (text if len(text) <= _MAX_DETAIL else
            text[:_MAX_DETAIL - 3].rstrip() + '...')


def _without_advice(message: str) -> str:
    """torch's message with the weights_only advice and its preamble
    removed; what the unpickler itself said, where it says it."""
    message = _ANSI.sub('', message)
    if 'WeightsUnpickler error:' in message:
        message = message.split('WeightsUnpickler error:', 1)[1]
    message = message.replace('Weights only load failed.', '')
    return _one_line(_ADVICE.sub('', message)).strip(' .') or 'no detail'


def _load_error(path: str, exc: BaseException) -> CheckpointFileError:
    """The one-line error for what ``torch.load`` raised on ``path``."""
    message = str(exc)
    if isinstance(exc, FileNotFoundError):
        return CheckpointFileError(path, 'no such file', missing=True)
    if isinstance(exc, IsADirectoryError):
        return CheckpointFileError(path, 'a directory, not a checkpoint file')
    if isinstance(exc, OSError):
        return CheckpointFileError(
            path, f'cannot be read ({exc.strerror or _one_line(message)})')
    if isinstance(exc, EOFError):
        return _not_a_checkpoint(path, 'the file ends early: truncated')
    if 'PytorchStreamReader' in message:
        detail = _one_line(message.split('. This is an internal')[0])
        return _not_a_checkpoint(path, f'a damaged zip archive: {detail}')
    if 'Invalid magic number' in message:
        return _not_a_checkpoint(path,
                                 'a pickle that torch.save did not write')
    refused = _REFUSED_GLOBAL.search(message)
    if isinstance(exc, pickle.UnpicklingError) and refused:
        name = (refused.group(1) or refused.group(2)).rstrip('.')
        detail = (f'it holds {name}, which torch.load(weights_only=True) '
                  f'refuses; {ALLOWED_TYPES}')
        return CheckpointFileError(path, detail, detail)
    if 'unexpected EOF' in message or 'file might be corrupted' in message:
        return _not_a_checkpoint(
            path, f'truncated or damaged: {_without_advice(message)}')
    if isinstance(exc, pickle.UnpicklingError):
        return _not_a_checkpoint(
            path, f'damaged pickle data: {_without_advice(message)}')
    return CheckpointFileError(
        path, f'cannot be loaded ({type(exc).__name__}: '
        f'{_without_advice(message)})',
        f'{type(exc).__name__}: {_without_advice(message)}')


def find_nonfinite_tensors(obj: Any,
                           prefix: str = '') -> List[Tuple[str, int, int]]:
    """(key, NaN count, Inf count) of every floating (or complex) tensor
    in ``obj`` (a checkpoint, a state dict, an optimizer state; dicts,
    lists and tuples are searched recursively) that is not finite.

    Keys join dict keys with ``.`` and list positions as ``[i]``, e.g.
    ``'state_dict.backbone.conv1.weight'`` or
    ``'optimizer.state.3.exp_avg'``.
    """
    found = []
    for key, tensor in _tensors(obj, prefix):
        if tensor.layout != torch.strided or not (tensor.is_floating_point()
                                                  or tensor.is_complex()):
            continue
        if bool(torch.isfinite(tensor).all()):
            continue
        nan = int(torch.isnan(tensor).sum())
        found.append((key, nan, int(torch.isinf(tensor).sum())))
    return found


def _tensors(obj: Any, prefix: str) -> Iterator[Tuple[str, torch.Tensor]]:
    if isinstance(obj, torch.Tensor):
        yield prefix or '<tensor>', obj
    elif isinstance(obj, Mapping):
        for key, value in obj.items():
            yield from _tensors(value,
                                f'{prefix}.{key}' if prefix else str(key))
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from _tensors(value, f'{prefix}[{i}]')


def check_finite(checkpoint: Any, path: str) -> None:
    """Raises :class:`NonFiniteCheckpointError` naming the tensors of
    ``checkpoint`` that hold NaN or Inf (the first few, and how many);
    ``path`` names the file."""
    found = find_nonfinite_tensors(checkpoint)
    if not found:
        return

    def counts(nan: int, inf: int) -> str:
        parts = [
            f'{n} {what}' for n, what in ((nan, 'NaN'), (inf, 'Inf')) if n
        ]
        return ', '.join(parts)

    named = ', '.join(f'{key} ({counts(nan, inf)})'
                      for key, nan, inf in found[:_NAMED_TENSORS])
    more = (f' and {len(found) - _NAMED_TENSORS} more'
            if len(found) > _NAMED_TENSORS else '')
    raise NonFiniteCheckpointError(
        path, f'non-finite values in {len(found)} tensor(s): {named}{more}; '
        'the file is damaged or was saved from a diverged run',
        [key for key, _, _ in found])


def load_checkpoint(path: str,
                    map_location: Union[str, torch.device, Callable,
                                        None] = 'cpu',
                    weights_only: Optional[bool] = None,
                    check_tensors: bool = True) -> Any:
    """Loads the checkpoint file at ``path``, refusing a bad one in one line.

    Args:
        path (str): A local file (``~`` is expanded).
        map_location: As for ``torch.load``. Defaults to ``'cpu'``.
        weights_only (bool, optional): None (default): as mmengine loads on
            this torch, ``weights_only=True`` where torch has the allow-list
            (torch >= 2.6), torch's full unpickling before (no allow-list
            there: only open files you trust). True: ``weights_only=True``
            on every torch (for files that hold only tensors and plain
            containers).
        check_tensors (bool): Refuse NaN and Inf in floating tensors.

    Returns:
        The loaded object (usually a dict).

    Raises:
        CheckpointFileError: The file is missing, unreadable, truncated,
            not a PyTorch checkpoint, or holds a type ``weights_only``
            loading refuses.
        NonFiniteCheckpointError: Tensors hold NaN or Inf.
    """
    path = osp.expanduser(str(path))
    probe_checkpoint_file(path)
    if weights_only is None:
        weights_only = True if WEIGHTS_ONLY_ALLOW_LIST else None
    kwargs = {} if weights_only is None else dict(weights_only=weights_only)
    try:
        checkpoint = torch.load(path, map_location=map_location, **kwargs)
    # Whatever a bad file makes the unpickler raise (UnpicklingError,
    # RuntimeError, EOFError, AttributeError for a missing class, ...).
    except Exception as exc:  # noqa: B902
        raise _load_error(path, exc) from None
    if check_tensors:
        check_finite(checkpoint, path)
    return checkpoint


def _checked_loader(loader: Callable) -> Callable:
    """mmengine's ``loader(filename, map_location)`` whose result is
    checked for non-finite tensors."""

    @functools.wraps(loader)
    def checked(filename, map_location):
        checkpoint = loader(filename, map_location)
        check_finite(checkpoint, filename)
        return checkpoint

    checked._kcla_checked = True
    return checked


# mmengine logs 'Loads checkpoint by <name[10:]> backend': keep 'local'.
def load_from_local(filename: str, map_location=None) -> Any:
    """mmengine's local checkpoint loader, by :func:`load_checkpoint`."""
    return load_checkpoint(filename, map_location=map_location)


load_from_local._kcla_checked = True


@contextlib.contextmanager
def checked_checkpoint_loading() -> Iterator[None]:
    """Within it, mmengine loads local checkpoint files with
    :func:`load_checkpoint` (one-line errors, non-finite tensors refused)
    and checks the tensors of what its other loaders (URLs,
    ``torchvision://``, ``open-mmlab://``, ...) return.

    Covers every mmengine path to a checkpoint: ``Runner.load_checkpoint``
    (``load_from``), ``Runner.resume``, the ``Pretrained`` initialiser and
    the inferencers. mmengine's loaders are back in place on exit; nesting
    is harmless.
    """
    from mmengine.runner.checkpoint import CheckpointLoader
    originals = {}
    for prefix, loader in list(CheckpointLoader._schemes.items()):
        if getattr(loader, '_kcla_checked', False):
            continue
        originals[prefix] = loader
        CheckpointLoader._schemes[prefix] = (
            load_from_local if prefix == '' else _checked_loader(loader))
    try:
        yield
    finally:
        # register_scheme() replaces the dict: restore in the current one.
        schemes = CheckpointLoader._schemes
        for prefix, loader in originals.items():
            if getattr(schemes.get(prefix), '_kcla_checked', False):
                schemes[prefix] = loader


def is_local_path(path: str) -> bool:
    """Whether mmengine would read ``path`` with its local loader (no
    ``scheme://`` prefix)."""
    return '://' not in str(path)


def without_module_prefix(state: dict) -> dict:
    """``state`` without DataParallel's ``module.`` prefix on its keys
    (keys of other types, which files may hold, as they are)."""
    prefix = 'module.'
    return {
        (k[len(prefix):] if str(k).startswith(prefix) else k): v
        for k, v in state.items()
    }
