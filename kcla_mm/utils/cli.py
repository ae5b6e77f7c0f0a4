# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Argument types and output-file helpers shared by the command-line tools
(and the library functions behind them)."""
import argparse
import os
import os.path as osp
from typing import Callable


def int_at_least(option: str, minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer >= ``minimum``, or an error that
    names ``option``, the text given and the bound."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(
                f'{option} {text}: not an integer >= {minimum}')
        return value

    return parse


def make_parent_dir(path: str) -> str:
    """Creates the folder of the output file ``path`` (and its parents) if
    missing, as ``torch.save`` does not; returns that folder."""
    folder = osp.dirname(osp.abspath(path))
    os.makedirs(folder, exist_ok=True)
    return folder


def current_umask() -> int:
    """The process's umask, read without changing it where Linux shows it
    (``/proc/self/status``, so other threads never see another one), else
    set and restored at once."""
    try:
        with open('/proc/self/status') as f:
            for line in f:
                if line.startswith('Umask:'):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def default_file_mode() -> int:
    """The permissions a plain ``open(path, 'w')`` gives a new file
    (``0o666`` less the umask), for a file first written under a private
    ``tempfile.mkstemp`` name (mode ``0o600``) and then renamed."""
    return 0o666 & ~current_umask()
