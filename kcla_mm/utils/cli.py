# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Argument types shared by the command-line tools."""
import argparse
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
