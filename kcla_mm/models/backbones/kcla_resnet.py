# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
from typing import Optional, Sequence

from ...registry import register_backbone
from ..layers import KCLALayer
from ..layers.kcla import IMPLEMENTATIONS
from ..layers.kcla.compiled import require_extension
from .arguments import (check_clamp, check_flag, check_int_sequence,
                        check_rate, check_temperature_range, is_int)
from .cross_layer_resnet import CrossLayerResNet


def check_kcla_args(temperature_range,
                    clamp,
                    kcla_drop_path,
                    renorm_blocks,
                    kcla_implementation,
                    num_stages: int,
                    kcla_recompute_outputs=True) -> None:
    """The KCLA options of the backbones, each error naming its key (the
    layers get them under other names: ``drop_path``, ``renorm``,
    ``implementation``)."""
    check_temperature_range('temperature_range', temperature_range)
    check_clamp('clamp', clamp)
    check_rate('kcla_drop_path', kcla_drop_path)
    check_flag('kcla_recompute_outputs', kcla_recompute_outputs)
    blocks = check_int_sequence('renorm_blocks', renorm_blocks)
    if any(b < 0 for b in blocks):
        raise ValueError(f'renorm_blocks={blocks} must be block indices '
                         'within a stage, >= 0 (a negative one matches no '
                         'block)')
    # num_stages: checked with the other ResNet options, after these.
    if 0 not in blocks and not (is_int(num_stages) and num_stages <= 1):
        raise ValueError(
            f'renorm_blocks={blocks} must contain 0: the first block of '
            'every stage after the first carries the state to a new width '
            "(the paper's Algorithm 1)")
    if kcla_implementation not in IMPLEMENTATIONS:
        raise ValueError(f'kcla_implementation={kcla_implementation!r} '
                         f'must be one of {IMPLEMENTATIONS}')
    if kcla_implementation == 'compiled':
        try:
            require_extension()
        except RuntimeError as error:
            raise RuntimeError(
                f'kcla_implementation={kcla_implementation!r}: {error}'
            ) from error


class KCLAResNetMixin:
    """What makes a layer-attention ResNet KCLA: its arguments and its
    :class:`KCLALayer` after every block. Put it before a
    :class:`~.cross_layer_resnet.CrossLayerResNetMixin` class in the bases
    (:class:`KCLAResNet`, and mmseg's ``KCLAResNet`` in
    :mod:`.mmseg_resnet`); the arguments are :class:`KCLAResNet`'s."""
    attention_name = 'kcla'

    def __init__(self,
                 depth: int,
                 head_dim: int = 64,
                 temperature_range: Sequence[float] = (0.7, 1 / 0.7),
                 clamp: float = 10.,
                 kcla_drop_path: float = 0.2,
                 renorm_blocks: Sequence[int] = (0, 11),
                 kcla_implementation: str = 'auto',
                 kcla_recompute_outputs: bool = True,
                 **kwargs):
        check_kcla_args(
            temperature_range=temperature_range,
            clamp=clamp,
            kcla_drop_path=kcla_drop_path,
            renorm_blocks=renorm_blocks,
            kcla_implementation=kcla_implementation,
            num_stages=kwargs.get('num_stages', 4),
            kcla_recompute_outputs=kcla_recompute_outputs)
        self.renorm_blocks = tuple(renorm_blocks)
        self.kcla_cfg = self.shared_layer_cfg(
            kwargs,
            head_dim=head_dim,
            temperature_range=tuple(temperature_range),
            clamp=clamp,
            drop_path=kcla_drop_path,
            implementation=kcla_implementation,
            recompute_block_input=bool(kcla_recompute_outputs))
        super().__init__(depth=depth, head_dim=head_dim, **kwargs)

    def make_attention(self, channels: int, block_index: int,
                       state_channels: Optional[int],
                       state_stride: int) -> KCLALayer:
        return KCLALayer(
            channels,
            state_channels=state_channels,
            state_stride=state_stride,
            # The network's very first block has no state to carry.
            renorm=block_index in self.renorm_blocks
            and state_channels is not None,
            **self.kcla_cfg)


# mmseg's registry has its own KCLAResNet, over mmseg's ResNet
# (.mmseg_resnet).
@register_backbone(registries=('mmdet', 'mmpretrain'))
class KCLAResNet(KCLAResNetMixin, CrossLayerResNet):
    """ResNet with Key-Correlated Layer Attention (arXiv 2606.28405).

    A thin subclass of mmdet's :class:`~mmdet.models.backbones.ResNet`
    (mmseg's registry holds the same over mmseg's ``ResNet``, with the
    ``KCLAResNetV1c`` / ``KCLAResNetV1d`` variants: :mod:`.mmseg_resnet`):
    every ResNet option keeps its meaning, and a :class:`KCLALayer` follows
    every residual block (at ``layerN.J.kcla``). The KCLA state flows
    through all stages and is carried across stage boundaries by the
    paper's Algorithm 1.

    Args:
        head_dim (int): Channels per KCLA head. Default: 64 (official).
        temperature_range (Sequence[float]): Range (low, high) of the
            log-uniform sequence whose reciprocals are the per-head
            temperatures: two positive numbers, finite in fp32, low <=
            high. Default: (0.7, 1 / 0.7) (official).
        clamp (float): Upper bound of ||K|| / tau before ``exp``, in (0,
            88.72) (exp(clamp) finite in fp32). Default: 10 (official).
        kcla_drop_path (float): Drop-path rate of the KCLA branch, in
            [0, 1). Default: 0.2 (official).
        renorm_blocks (Sequence[int]): Block indices (>= 0) within a stage
            whose KCLA layer re-normalises the state; 0 is needed when
            there is more than one stage (the state changes width there).
            Default: (0, 11) (official; block 11 exists only in the deep
            stages of ResNet-101/152).
        kcla_implementation (str): ``'auto'`` (the compiled CPU kernels
            where they apply, else ``'fused'``), ``'compiled'``,
            ``'fused'``, ``'reference'`` or ``'recompute'`` (less
            activation memory in pure PyTorch), see
            :class:`~kcla_mm.models.layers.KCLALayer`. Default: 'auto'.
        kcla_recompute_outputs (bool): In a train step on the compiled
            kernels, recompute each KCLA layer's output in backward where
            the next block's convs read it, instead of keeping it: the
            activation memory falls to about ResNet's (1.02-1.03x, from
            1.27-1.31x), for one more pass of each branch per step (1-2%
            of a ResNet-50 step, docs/benchmarks.md); gradients are bit for
            bit the same. False keeps the outputs. See the layer's
            ``recompute_block_input``. Default: True.
        zero_init_attention (bool): Start every attention branch at zero
            (warm start from plain ResNet weights), see
            :class:`CrossLayerResNetMixin`. Default: False.
        **kwargs: Arguments of mmdet's ``ResNet`` (depth, in_channels,
            base_channels, num_stages, strides, dilations, out_indices, style,
            deep_stem, avg_down, frozen_stages, conv_cfg, norm_cfg, norm_eval,
            with_cp, zero_init_residual, plugins, init_cfg, ...).

    Example:
        >>> import torch
        >>> from kcla_mm.models import KCLAResNet
        >>> self = KCLAResNet(depth=18, head_dim=32).eval()
        >>> for out in self(torch.rand(1, 3, 64, 64)):
        ...     print(tuple(out.shape))
        (1, 64, 16, 16)
        (1, 128, 8, 8)
        (1, 256, 4, 4)
        (1, 512, 2, 2)
    """
