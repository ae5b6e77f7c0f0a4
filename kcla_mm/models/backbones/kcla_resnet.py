# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
from typing import Optional, Sequence, Tuple

import torch.utils.checkpoint as cp
from mmdet.models.backbones import ResNet
from mmdet.models.layers import ResLayer
from torch import Tensor

from ..layers import KCLALayer, KCLAState


class KCLAResLayer(ResLayer):
    """A ResNet stage with a KCLA layer after every residual block.

    The blocks are built by mmdet's ``ResLayer`` unchanged (so plain ResNet
    weights keep their ``layerN.J.*`` keys); block ``J`` gets a child
    ``kcla`` that this stage calls after it, threading the KCLA state.

    Args:
        state_channels (int, optional): Width of the state arriving from the
            previous stage; None for the first stage (no incoming state).
        renorm_blocks (Sequence[int]): Indices of the blocks that
            re-normalise the state (Algorithm 1).
        kcla_cfg (dict): Keyword arguments shared by all ``KCLALayer``.
        **kwargs: Arguments of mmdet's ``ResLayer``.
    """

    def __init__(self, state_channels: Optional[int],
                 renorm_blocks: Sequence[int], kcla_cfg: dict, **kwargs):
        super().__init__(**kwargs)
        channels = kwargs['planes'] * kwargs['block'].expansion
        for j, block in enumerate(self):
            first = j == 0
            block.kcla = KCLALayer(
                channels,
                state_channels=state_channels if first else None,
                state_stride=kwargs.get('stride', 1) if first else 1,
                # The network's very first block has no state to carry.
                renorm=j in renorm_blocks
                and not (first and state_channels is None),
                **kcla_cfg)

    def forward(self, x: Tensor,
                state: Optional[KCLAState]) -> Tuple[Tensor, KCLAState]:
        for block in self:
            x = block(x)
            if block.with_cp and x.requires_grad:
                x, state = cp.checkpoint(
                    block.kcla, x, state, use_reentrant=False)
            else:
                x, state = block.kcla(x, state)
        return x, state


class KCLAResNet(ResNet):
    """ResNet with Key-Correlated Layer Attention (arXiv 2606.28405).

    A thin subclass of mmdet's :class:`~mmdet.models.backbones.ResNet`: every
    ResNet option keeps its meaning, and a :class:`KCLALayer` follows every
    residual block. The KCLA state flows through all stages and is carried
    across stage boundaries by the paper's Algorithm 1.

    Args:
        head_dim (int): Channels per KCLA head. Default: 64 (official).
        temperature_range (Sequence[float]): Range of the log-uniform
            sequence whose reciprocals are the per-head temperatures.
            Default: (0.7, 1 / 0.7) (official).
        clamp (float): Upper bound of ||K|| / tau before ``exp``.
            Default: 10 (official).
        kcla_drop_path (float): Drop-path rate of the KCLA branch.
            Default: 0.2 (official).
        renorm_blocks (Sequence[int]): Block indices within a stage whose
            KCLA layer re-normalises the state. Default: (0, 11) (official;
            block 11 exists only in the deep stages of ResNet-101/152).
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

    def __init__(self,
                 depth: int,
                 head_dim: int = 64,
                 temperature_range: Sequence[float] = (0.7, 1 / 0.7),
                 clamp: float = 10.,
                 kcla_drop_path: float = 0.2,
                 renorm_blocks: Sequence[int] = (0, 11),
                 **kwargs):
        self._check_args(depth, head_dim, kwargs)
        # make_res_layer() runs inside ResNet.__init__ and needs these.
        self.in_channels = kwargs.get('in_channels', 3)
        self.renorm_blocks = tuple(renorm_blocks)
        self.kcla_cfg = dict(
            head_dim=head_dim,
            temperature_range=tuple(temperature_range),
            clamp=clamp,
            drop_path=kcla_drop_path,
            conv_cfg=kwargs.get('conv_cfg'),
            norm_cfg=kwargs.get('norm_cfg', dict(type='BN',
                                                 requires_grad=True)))
        super().__init__(depth=depth, **kwargs)

    @classmethod
    def _check_args(cls, depth, head_dim, kwargs) -> None:
        """Fails early, naming the field, where mmdet would assert or fail
        deep inside the build."""
        if depth not in cls.arch_settings:
            raise ValueError(f'depth={depth!r} is not supported by '
                             f'KCLAResNet; choose from '
                             f'{sorted(cls.arch_settings)}')
        num_stages = kwargs.get('num_stages', 4)
        if not 1 <= num_stages <= 4:
            raise ValueError(f'num_stages={num_stages} must be in 1..4')
        for field, default in (('strides', (1, 2, 2, 2)),
                               ('dilations', (1, 1, 1, 1))):
            value = kwargs.get(field, default)
            if len(value) != num_stages:
                raise ValueError(
                    f'{field}={tuple(value)} must have num_stages='
                    f'{num_stages} entries, got {len(value)}')
        expansion = cls.arch_settings[depth][0].expansion
        base = kwargs.get('base_channels', 64)
        for i in range(num_stages):
            width = base * 2**i * expansion
            if head_dim <= 0 or width % head_dim:
                raise ValueError(
                    f'head_dim={head_dim} must divide every stage width; '
                    f'stage {i} has width {width}')

    def make_res_layer(self, **kwargs) -> KCLAResLayer:
        # Called once per stage, in order, before the stage is registered.
        first_stage = len(self.res_layers) == 0
        return KCLAResLayer(
            state_channels=None if first_stage else kwargs['inplanes'],
            renorm_blocks=self.renorm_blocks,
            kcla_cfg=self.kcla_cfg,
            **kwargs)

    def train(self, mode: bool = True) -> 'KCLAResNet':
        # mmdet's ResNet.train() returns None; nn.Module's contract (and
        # `model = KCLAResNet(...).eval()`) expects the module back.
        super().train(mode)
        return self

    def forward(self, x: Tensor) -> Tuple[Tensor, ...]:
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(
                f'KCLAResNet expects input of shape (N, in_channels='
                f'{self.in_channels}, H, W), got {tuple(x.shape)}')
        if self.deep_stem:
            x = self.stem(x)
        else:
            x = self.relu(self.norm1(self.conv1(x)))
        x = self.maxpool(x)
        outs = []
        state = None
        for i, layer_name in enumerate(self.res_layers):
            x, state = getattr(self, layer_name)(x, state)
            if i in self.out_indices:
                outs.append(x)
        return tuple(outs)
