"""KCLA-ResNet under FSDP (torch's FullyShardedDataParallel, version 1)
wrapping the whole model, in a gloo process group of one on the CPU: a
train step gives the gradients of the unwrapped model for every
implementation, with and without ``use_orig_params``.

With ``use_orig_params=False`` FSDP replaces each module's parameters by
views of one flat parameter, so ``module.parameters()`` of a submodule is
empty: the recomputing paths must reach Algorithm 1's parameters through
the modules' attributes, or those parameters silently get no gradient.
"""
import pytest
import torch
import torch.distributed as dist

from helpers import free_port, small_kcla


@pytest.fixture(scope='module')
def process_group():
    """A gloo group of one, where this torch's FSDP runs on the CPU at all
    (torch 2.1's does not: its first forward asks for a CUDA stream)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    dist.init_process_group(
        'gloo',
        init_method=f'tcp://127.0.0.1:{free_port()}',
        rank=0,
        world_size=1)
    try:
        FSDP(
            torch.nn.Linear(2, 2), device_id=torch.device('cpu'))(
                torch.rand(1, 2))
    except Exception as exc:  # noqa: B902  whatever this torch raises
        dist.destroy_process_group()
        pytest.skip(f'FSDP cannot run on the CPU in torch '
                    f'{torch.__version__}: {exc!r}')
    yield
    dist.destroy_process_group()


def sgd_step(model, x):
    """One train step and a plain SGD update (lr 1) of every parameter."""
    sum(out.sum() for out in model(x)).backward()
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= p.grad


@pytest.mark.parametrize('use_orig_params', [False, True])
@pytest.mark.parametrize('implementation', ['auto', 'recompute', 'fused'])
def test_whole_model_fsdp_gives_the_unwrapped_gradients(
        process_group, implementation, use_orig_params):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    reference = small_kcla(implementation)
    model = small_kcla(implementation)
    model.load_state_dict(reference.state_dict())
    x = torch.rand(2, 3, 64, 64)
    sgd_step(reference, x)
    wrapped = FSDP(
        model, device_id=torch.device('cpu'), use_orig_params=use_orig_params)
    sgd_step(wrapped, x)
    with FSDP.summon_full_params(wrapped):
        updated = dict(model.named_parameters())
        for name, want in reference.named_parameters():
            # A parameter without a gradient would keep its initial value.
            torch.testing.assert_close(
                updated[name], want, atol=1e-5, rtol=1e-4, msg=name)
