"""Run by tests/test_distributed_wrappings.py under torchrun (gloo, CPU,
2 processes): a narrow KCLA-ResNet-18 (or LA / MRLA-light) trained 3 SGD
steps under one wrapping, against one process doing the same 2-rank
computation (each rank's half of the batch through the unwrapped model, the
gradients averaged); and, before the training, an eval forward without
autograd (a validation loop's) through the wrapping against the unwrapped
model's. Rank 0 writes ``{case: result}`` as JSON to the path given, where
result is ``{'max_diff': float, 'max_update_diff': float, 'eval_diff':
float}`` (the largest difference of any parameter after 3 steps, of any
parameter's update relative to the largest entry of that update, or 1e-4
if smaller, and of any eval output) or ``{'error': 'Type: message'}``.

    torchrun --nproc_per_node 2 tests/distributed_wrappings.py OUT.json \
        CASE [CASE ...]

A case is ``WRAPPING:IMPLEMENTATION[:BACKBONE]``; WRAPPING is one of
:data:`WRAPPINGS`.
"""
import functools
import gc
import json
import os
import sys
import traceback

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.dirname(__file__))

from helpers import small_backbone  # noqa: E402

STEPS, LR = 3, 0.001


def build(implementation: str, backbone: str, with_cp: bool) -> nn.Module:
    from kcla_mm.models import KCLAResNet, LAResNet, MRLALightResNet
    torch.manual_seed(0)
    if backbone == 'kcla':
        return small_backbone(
            KCLAResNet,
            head_dim=16,
            kcla_drop_path=0.,
            norm_eval=False,
            with_cp=with_cp,
            kcla_implementation=implementation)
    cls, drop = {
        'la': (LAResNet, 'la_drop_path'),
        'mrla-light': (MRLALightResNet, 'mrla_light_drop_path')
    }[backbone]
    return small_backbone(
        cls, head_dim=16, norm_eval=False, with_cp=with_cp, **{drop: 0.})


def loss_of(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return sum((out**2).mean() for out in model(x))


def inputs(step: int, rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.rand(2, 3, 64, 64, generator=g)


def reference(model: nn.Module, world: int) -> dict:
    """The 2-rank computation in one process."""
    for step in range(STEPS):
        model.zero_grad()
        for rank in range(world):
            (loss_of(model, inputs(step, rank)) / world).backward()
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p -= LR * p.grad
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def eval_difference(wrapped: nn.Module, single: nn.Module, rank: int) -> float:
    """The largest difference between the outputs of an eval forward
    without autograd through the wrapping and through ``single``, the
    unwrapped model with the same weights and buffers."""
    x = inputs(STEPS, rank)
    with torch.no_grad():
        got = wrapped.eval()(x)
        want = single.eval()(x)
    wrapped.train()
    return max((a - b).abs().max().item() for a, b in zip(got, want))


def block_classes():
    from mmdet.models.backbones.resnet import BasicBlock, Bottleneck
    return BasicBlock, Bottleneck


def attention_classes():
    from kcla_mm.models.layers import KCLALayer, LALayer, MRLALightLayer
    return KCLALayer, LALayer, MRLALightLayer


def stage_class():
    from mmdet.models.layers import ResLayer
    return ResLayer


def fsdp1(model, classes=None, use_orig_params=False):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    policy = None if classes is None else ModuleWrapPolicy(set(classes))
    return FSDP(
        model,
        device_id=torch.device('cpu'),
        auto_wrap_policy=policy,
        use_orig_params=use_orig_params)


def fsdp2(model, classes):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh('cpu', (dist.get_world_size(), ))
    for module in list(model.modules())[::-1]:
        if isinstance(module, classes) and module is not model:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def checkpointed(model, classes):
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper)
    apply_activation_checkpointing(
        model,
        checkpoint_wrapper_fn=functools.partial(
            checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
        check_fn=lambda m: isinstance(m, classes))
    return nn.parallel.DistributedDataParallel(model)


def ddp(model):
    return nn.parallel.DistributedDataParallel(model)


#: wrapping name -> (wrap(model) -> model, build with with_cp)
WRAPPINGS = {
    'ddp': (ddp, False),
    'ddp-with_cp': (ddp, True),
    'ddp-checkpoint-block':
    (lambda m: checkpointed(m, block_classes()), False),
    'ddp-checkpoint-layer': (lambda m: checkpointed(m, attention_classes()),
                             False),
    'fsdp1-whole': (fsdp1, False),
    'fsdp1-whole-orig': (functools.partial(fsdp1,
                                           use_orig_params=True), False),
    'fsdp1-block': (lambda m: fsdp1(m, block_classes()), False),
    'fsdp1-block-orig':
    (lambda m: fsdp1(m, block_classes(), use_orig_params=True), False),
    'fsdp1-stage': (lambda m: fsdp1(m, (stage_class(), )), False),
    'fsdp1-block-layer':
    (lambda m: fsdp1(m,
                     block_classes() + attention_classes()), False),
    'fsdp2-block': (lambda m: fsdp2(m, block_classes()), False),
    'fsdp2-stage': (lambda m: fsdp2(m, (stage_class(), )), False),
    'fsdp2-block-layer':
    (lambda m: fsdp2(m,
                     block_classes() + attention_classes()), False),
}


def full_parameters(wrapped: nn.Module, model: nn.Module) -> dict:
    """The model's parameters after training, unsharded."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    if isinstance(wrapped, FSDP):
        with FSDP.summon_full_params(wrapped):
            return {
                k.replace('_fsdp_wrapped_module.', ''): v.detach().clone()
                for k, v in model.named_parameters()
            }
    out = {}
    for k, v in wrapped.named_parameters():
        if hasattr(v, 'full_tensor'):  # FSDP2's DTensor
            v = v.full_tensor()
        k = k.replace('module.', '', 1) if k.startswith('module.') else k
        out[k.replace('_checkpoint_wrapped_module.', '')] = v.detach().clone()
    return out


def run_case(case: str, rank: int, world: int) -> dict:
    wrapping, implementation, *rest = case.split(':')
    backbone = rest[0] if rest else 'kcla'
    wrap, with_cp = WRAPPINGS[wrapping]
    model = build(implementation, backbone, with_cp)
    start = {k: v.detach().clone() for k, v in model.named_parameters()}
    want = reference(build(implementation, backbone, with_cp), world)
    wrapped = wrap(model)
    # Built before any forward, as mmengine's runner builds it: after a
    # forward without autograd FSDP2 leaves the unsharded parameters in
    # the module, which an optimizer built then would take.
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=LR)
    eval_diff = eval_difference(wrapped,
                                build(implementation, backbone, with_cp), rank)
    for step in range(STEPS):
        optimizer.zero_grad()
        loss_of(wrapped, inputs(step, rank)).backward()
        optimizer.step()
    got = full_parameters(wrapped, model)
    missing = sorted(set(want) - set(got))
    if missing:
        return {'error': f'parameters not found after wrapping: {missing}'}
    # A parameter without its gradient barely moves at this learning rate:
    # compare each parameter's update too, relative to its size.
    update_diff = 0.
    for k, v in want.items():
        # Floor: a parameter that barely moves gives a noisy ratio.
        moved = max((v - start[k]).abs().max().item(), 1e-4)
        update_diff = max(update_diff,
                          ((got[k] - start[k]) -
                           (v - start[k])).abs().max().item() / moved)
    return {
        'eval_diff': eval_diff,
        'max_diff': max(
            (got[k] - v).abs().max().item() for k, v in want.items()),
        'max_update_diff': update_diff
    }


def main() -> None:
    out_path, cases = sys.argv[1], sys.argv[2:]
    dist.init_process_group('gloo')
    rank, world = dist.get_rank(), dist.get_world_size()
    results = {}
    for case in cases:
        try:
            results[case] = run_case(case, rank, world)
        except Exception as exc:  # noqa: B902  reported per case
            msg = str(exc).strip().splitlines()
            results[case] = {
                'error': f'{type(exc).__name__}: {msg[0] if msg else ""}',
                'trace': traceback.format_exc()[-3000:]
            }
        dist.barrier()
    if rank == 0:
        with open(out_path, 'w') as f:
            json.dump(results, f, indent=1)
    # The wrapped models hold the group; freed here rather than at
    # interpreter exit, where gloo's threads can abort the process.
    gc.collect()
    dist.destroy_process_group()


if __name__ == '__main__':
    main()
