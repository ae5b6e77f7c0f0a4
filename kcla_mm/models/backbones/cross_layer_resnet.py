# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""The backbone machinery shared by every layer-attention ResNet.

A layer-attention ResNet is a ResNet with one module after every residual
block. The module takes the block output and a state carried from the
previous block (None at the network's first block) and returns the new
block output and the new state. What the state holds is the module's
business: a recurrent sum (KCLA), a cache of all earlier blocks (LA), the
previous attention output (MRLA-light).

The machinery is two mixins, put in front of a ResNet / ResLayer pair:
:class:`CrossLayerResNet` is it over mmdet's ``ResNet`` (registered in
mmdet's and mmpretrain's MODELS), :class:`MMSegCrossLayerResNet` over
mmseg's, whose stages also take ``multi_grid`` and ``contract_dilation``
(registered in mmseg's MODELS).
"""
from typing import Callable, Optional, Tuple

import torch.nn as nn
from mmdet.models.backbones import ResNet
from mmdet.models.layers import ResLayer
from mmseg.models.backbones import ResNet as MMSegResNet
from mmseg.models.utils import ResLayer as MMSegResLayer
from torch import Tensor

from ..layers.cross_layer_block import cross_layer_block
from .arguments import check_flag, check_multi_grid, check_resnet_args, is_int
from .errors import BackboneTypeError

# make_attention(channels, block_index, state_channels, state_stride)
AttentionFactory = Callable[[int, int, Optional[int], int], nn.Module]


class CrossLayerResLayerMixin:
    """A ResNet stage with a layer-attention module after every block.

    Put it before a ``ResLayer`` class in the bases. The blocks are built by
    that ``ResLayer`` from the cross-layer subclass of the ResNet's block
    class (:mod:`~kcla_mm.models.layers.cross_layer_block`: the same
    modules, so plain ResNet weights keep their ``layerN.J.*`` keys);
    block ``J`` gets a child named ``attention_name`` that it calls in its
    own forward, ``block(x, state) -> (x, state)``, so that a wrapper of
    the block (FSDP per block) covers its attention module too.

    Args:
        attention_name (str): Attribute name of the module on each block,
            e.g. ``'kcla'``; it is the key prefix in the state dict.
        make_attention (callable): ``make_attention(channels, block_index,
            state_channels, state_stride)`` builds the module of one block.
            ``state_channels`` is the width of the incoming state (None at
            the network's first block, which receives none) and
            ``state_stride`` the spatial stride between that state and the
            block output.
        in_state_channels (int, optional): Width of the state arriving from
            the previous stage; None for the first stage.
        **kwargs: Arguments of the ``ResLayer``.
    """

    def __init__(self, attention_name: str, make_attention: AttentionFactory,
                 in_state_channels: Optional[int], **kwargs):
        kwargs['block'] = cross_layer_block(kwargs['block'])
        super().__init__(**kwargs)
        self.attention_name = attention_name
        channels = kwargs['planes'] * kwargs['block'].expansion
        # The first stage's stride (mmdet allows strides[0] > 1) is no
        # state's stride: its first block receives no state.
        in_state_stride = (1 if in_state_channels is None else kwargs.get(
            'stride', 1))
        for j, block in enumerate(self):
            first = j == 0
            block.attention_name = attention_name
            setattr(
                block, attention_name,
                make_attention(channels, j,
                               in_state_channels if first else channels,
                               in_state_stride if first else 1))

    def forward(self, x: Tensor, state) -> Tuple[Tensor, object]:
        for block in self:
            x, state = block(x, state)
        return x, state


class CrossLayerResLayer(CrossLayerResLayerMixin, ResLayer):
    """:class:`CrossLayerResLayerMixin` over mmdet's ``ResLayer``."""


class MMSegCrossLayerResLayer(CrossLayerResLayerMixin, MMSegResLayer):
    """:class:`CrossLayerResLayerMixin` over mmseg's ``ResLayer`` (which
    also takes ``multi_grid`` and ``contract_dilation``)."""


class CrossLayerResNetMixin:
    """A ResNet with a layer-attention module after every block.

    Put it before a ResNet class in the bases, and set ``res_layer_class``
    to the matching :class:`CrossLayerResLayerMixin` class. Subclasses set
    ``attention_name`` and implement :meth:`make_attention`; every ResNet
    option keeps its meaning. The state flows through all stages; carrying
    it across a change of width or size is the module's job (it is told
    both when it is built: a stage of stride 1, as the dilated stages of a
    segmentation ResNet, changes the width but not the size).

    Args:
        depth (int): ResNet depth, a key of ``arch_settings``.
        head_dim (int): Channels per attention head; must divide every stage
            width.
        zero_init_attention (bool): Start every attention branch at zero
            through a learnable per-channel scale (``branch_scale``, one
            per layer) that starts at 0, so that plain ResNet weights
            (torchvision or open-mmlab keys, e.g. ``init_cfg=dict(
            type='Pretrained', checkpoint='torchvision://resnet50')``) give
            the plain ResNet's features at step 0, in train and eval mode
            (bit for bit, except in KCLA's compiled inference, which
            computes each block's last BatchNorm in its own order: within
            float rounding), and the branches grow from there. The branches of
            KCLA and LA end in ``ReLU(Norm(.))``; zeroing the norm's weight
            (as ``zero_init_residual`` does in a block) would put the ReLU
            at 0, where its gradient is 0, and the branches would never
            train. The scales are not in plain or official checkpoints
            (reported missing, they stay 0); a checkpoint trained with the
            option needs the option to load. The branches of stages frozen
            by ``frozen_stages`` stay at zero, and under ``norm_eval`` the
            attention norms keep their initial running statistics (a plain
            checkpoint has none for them). Default: False (the official
            architecture, no extra parameter).
        **kwargs: Arguments of the ResNet class.
    """
    attention_name = 'attention'
    res_layer_class: type = None

    def __init__(self,
                 depth: int,
                 head_dim: int,
                 zero_init_attention: bool = False,
                 **kwargs):
        self.zero_init_attention = zero_init_attention
        self._check_args(depth, head_dim, kwargs)
        # make_res_layer() runs inside ResNet.__init__ and needs this.
        self.in_channels = kwargs.get('in_channels', 3)
        super().__init__(depth=depth, **kwargs)

    def _check_args(self, depth, head_dim, kwargs) -> None:
        """Fails early, naming the field, where mmdet / mmseg would assert or
        fail deep inside the build, or take the value silently; each error
        is also of the type their ResNet raises for it (:mod:`.errors`)."""
        # self: a CIFAR layout sets its arch_settings per instance.
        check_resnet_args(
            type(self).__name__, self.arch_settings, depth, kwargs)
        check_flag('zero_init_attention', self.zero_init_attention)
        num_stages = kwargs.get('num_stages', 4)
        expansion = self.arch_settings[depth][0].expansion
        base = kwargs.get('base_channels', 64)
        if not is_int(head_dim):
            raise BackboneTypeError(
                f'head_dim={head_dim!r} must be a positive integer that '
                'divides every stage width')
        for i in range(num_stages):
            width = base * 2**i * expansion
            if head_dim <= 0 or width % head_dim:
                raise ValueError(
                    f'head_dim={head_dim} must divide every stage width; '
                    f'stage {i} has width {width}')

    @staticmethod
    def shared_layer_cfg(resnet_kwargs: dict, **layer_cfg) -> dict:
        """``layer_cfg`` plus the ResNet's ``conv_cfg`` and ``norm_cfg``,
        which the attention modules use too (so SyncBN/GN reach them), and
        ``zero_init_attention`` as the layers' ``zero_init_branch``."""
        return dict(
            layer_cfg,
            zero_init_branch=resnet_kwargs.get('zero_init_attention', False),
            conv_cfg=resnet_kwargs.get('conv_cfg'),
            norm_cfg=resnet_kwargs.get('norm_cfg',
                                       dict(type='BN', requires_grad=True)))

    def make_attention(self, channels: int, block_index: int,
                       state_channels: Optional[int],
                       state_stride: int) -> nn.Module:
        """The layer-attention module after block ``block_index`` of a
        stage (see :class:`CrossLayerResLayer`)."""
        raise NotImplementedError

    def make_res_layer(self, **kwargs) -> CrossLayerResLayer:
        # Called once per stage, in order, before the stage is registered;
        # kwargs are the ResNet's own (mmseg's add multi_grid and
        # contract_dilation) and go to its ResLayer unchanged.
        first_stage = len(self.res_layers) == 0
        return self.res_layer_class(
            attention_name=self.attention_name,
            make_attention=self.make_attention,
            in_state_channels=None if first_stage else kwargs['inplanes'],
            **kwargs)

    def train(self, mode: bool = True) -> nn.Module:
        # mmdet's and mmseg's ResNet.train() return None; nn.Module's
        # contract (and `model = KCLAResNet(...).eval()`) expects the
        # module back.
        super().train(mode)
        return self

    def forward(self, x: Tensor) -> Tuple[Tensor, ...]:
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(
                f'{type(self).__name__} expects input of shape (N, '
                f'in_channels={self.in_channels}, H, W), got '
                f'{tuple(x.shape)}')
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


class CrossLayerResNet(CrossLayerResNetMixin, ResNet):
    """mmdet's ResNet with a layer-attention module after every block (see
    :class:`CrossLayerResNetMixin`). Args: those of the mixin and of mmdet's
    ``ResNet``."""
    res_layer_class = CrossLayerResLayer


class MMSegCrossLayerResNet(CrossLayerResNetMixin, MMSegResNet):
    """mmseg's ResNet with a layer-attention module after every block (see
    :class:`CrossLayerResNetMixin`).

    Every option of mmseg's ``ResNet`` keeps mmseg's meaning and state-dict
    keys (``multi_grid`` and ``contract_dilation`` included; ``norm_eval``
    and ``zero_init_residual`` keep mmseg's defaults, False and True), with
    one exception kept from the classes that these replace in mmseg's
    registry: ``stem_channels`` None (the default) is ``base_channels``,
    mmdet's rule, so that the narrow encoders of existing configs and
    checkpoints (``base_channels=32``) keep their stem. With the default
    ``base_channels=64`` that is mmseg's 64.

    Args:
        stem_channels (int, optional): Width of the stem. Default: None
            (``base_channels``).
        **kwargs: Arguments of the mixin and of mmseg's ``ResNet``.
    """
    res_layer_class = MMSegCrossLayerResLayer

    def __init__(self,
                 depth: int,
                 stem_channels: Optional[int] = None,
                 **kwargs):
        if stem_channels is None:
            stem_channels = kwargs.get('base_channels', 64)
        super().__init__(depth=depth, stem_channels=stem_channels, **kwargs)

    def _check_args(self, depth, head_dim, kwargs) -> None:
        super()._check_args(depth, head_dim, kwargs)
        # mmseg's own options.
        if 'contract_dilation' in kwargs:
            check_flag('contract_dilation', kwargs['contract_dilation'])
        num_stages = kwargs.get('num_stages', 4)
        check_multi_grid(
            kwargs.get('multi_grid'),
            self.arch_settings[depth][1][num_stages - 1])
