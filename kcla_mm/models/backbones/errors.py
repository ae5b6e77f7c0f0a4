# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Argument errors of the layer-attention backbones.

Each names the offending field, as a ValueError, and is also an instance of
the exception that mmdet's and mmseg's ``ResNet`` raise for the same input
(``KeyError`` for an unknown depth, ``AssertionError`` for ``num_stages``
out of range or ``strides`` / ``dilations`` of the wrong length), so that
code written against either kind of caller keeps working.
"""


class BackboneKeyError(ValueError, KeyError):
    """A field value that mmdet's / mmseg's ResNet rejects with KeyError
    (an unknown ``depth``)."""

    def __str__(self) -> str:
        # KeyError's __str__ would quote the message as a key.
        return ValueError.__str__(self)


class BackboneAssertionError(ValueError, AssertionError):
    """A field value that mmdet's / mmseg's ResNet rejects with an
    assertion (``num_stages``, the lengths of ``strides`` and
    ``dilations``, ``out_indices``)."""
