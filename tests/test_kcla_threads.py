"""The compiled KCLA kernels on torch's intra-op threads (issue 27): built
with OpenMP against the runtime torch itself loaded (so that every
at::parallel_for in kcla_mm/csrc splits its planes across threads, and no
second runtime joins the process), and with results that do not depend on
the thread count: forward values, states, running statistics and every
gradient are bit for bit those of one thread."""
import os
import re

import pytest
import torch

from kcla_mm.models import KCLAResNet
from kcla_mm.models.layers import KCLALayer, KCLAState
from helpers import assert_close_to_max, dynamic_symbols, incoming_state
from official_reference import randomise_

if os.environ.get('KCLA_MM_NO_EXTENSION', '0') not in ('', '0'):
    pytest.skip(
        'KCLA_MM_NO_EXTENSION is set: kcla_mm was installed without its '
        'C++ kernels',
        allow_module_level=True)

#: 1, 2 and more threads than most CI machines have cores: each splits the
#: planes differently.
THREADS = (1, 2, 4)

#: File names of OpenMP runtimes (setup.py's OPENMP_RUNTIME): GNU libgomp,
#: also as auditwheel's libgomp-<hash>.so.1, Intel's libiomp5, LLVM's libomp.
OPENMP_RUNTIME = re.compile(
    r'^lib(?:gomp|iomp5|omp)(?:-[0-9a-f]+)?\.so(?:\.[0-9]+)*$')

requires_openmp_torch = pytest.mark.skipif(
    'parallel backend: OpenMP' not in torch.__config__.parallel_info(),
    reason='torch runs at::parallel_for on its native thread pool, not '
    'OpenMP: the kernels need no OpenMP of their own')


def at_each_thread_count(fn):
    """fn() run under torch.set_num_threads(t) for each of THREADS, the
    count restored after; the seed reset before each run (drop path)."""
    before = torch.get_num_threads()
    results = []
    try:
        for threads in THREADS:
            torch.set_num_threads(threads)
            torch.manual_seed(0)
            results.append(fn())
    finally:
        torch.set_num_threads(before)
    return results


def assert_bitwise_equal(results, torch_reduced=()):
    """Every tensor of each run equal to the one-thread run's, bit for
    bit; those named in ``torch_reduced`` (PyTorch's own reductions, see
    test_train_step_does_not_depend_on_threads) to fp32 rounding."""
    one, *others = results
    for threads, other in zip(THREADS[1:], others):
        assert list(one) == list(other)  # the same names, in order
        for name in one:
            if name in torch_reduced:
                assert_close_to_max(other[name], one[name], 1e-4)
                continue
            assert torch.equal(one[name], other[name]), (
                f'{name}: {threads} threads differ from 1 by '
                f'{(one[name] - other[name]).abs().max().item()}')


def adapt_layer(drop_path):
    """A renormalising layer with a strided state adapter (128 -> 256
    channels, 17x13 -> 9x7), run by the kernels."""
    return randomise_(
        KCLALayer(
            256,
            state_channels=128,
            state_stride=2,
            renorm=True,
            drop_path=drop_path,
            implementation='compiled'))


@pytest.mark.parametrize('case', ['adapt', 'carry', 'first'])
def test_inference_does_not_depend_on_threads(ext, case):
    layer = adapt_layer(0.2) if case == 'adapt' else randomise_(
        KCLALayer(256, drop_path=0.2, implementation='compiled'))
    layer.eval()
    x = torch.rand(3, 256, 9, 7)
    state = incoming_state(case, 3)

    def run():
        with torch.no_grad():
            out, new = layer(x, state)
        assert layer.last_implementation == 'compiled'
        return dict(out=out, u=new.u, z=new.z)

    assert_bitwise_equal(at_each_thread_count(run))


@pytest.mark.parametrize('drop_path', [0., 0.5])
def test_train_step_does_not_depend_on_threads(ext, monkeypatch, drop_path):
    """Forward with the batch's statistics, the running statistics it
    updates, and backward (the kernels' per-plane sums reduced to the
    parameters' shapes) through a renormalising, adapting layer; drop
    path with a fixed seed.

    All but the gradient of Algorithm 1's ECA conv1d weight: that is
    PyTorch's own conv1d backward, whose reduction over batch and channels
    is split by thread count (F.conv1d alone: 1 and 2 threads differ in
    torch 2.1.2 and 2.13). Its input and incoming gradient are compared
    bit for bit instead, and its weight's gradient only to fp32 rounding.
    The query and key convs' gradients are the kernels' (CompiledPooled),
    bit for bit."""
    layer = adapt_layer(drop_path).train()
    x0 = torch.rand(3, 256, 9, 7)
    state0 = incoming_state('adapt', 3)
    g = torch.Generator().manual_seed(1)
    grad_out = torch.randn(3, 256, 9, 7, generator=g)
    grad_u = torch.randn(3, 256, 9, 7, generator=g)
    initial = {k: v.clone() for k, v in layer.state_dict().items()}
    conv1d_calls = []

    def recording_conv1d(inp, *args, **kwargs):
        out = conv1d(inp, *args, **kwargs)
        entry = {f'conv1d {len(conv1d_calls)} input': inp.detach().clone()}
        conv1d_calls.append(entry)
        if out.requires_grad:
            name = f'conv1d {len(conv1d_calls) - 1} grad_output'
            out.register_hook(lambda g: entry.__setitem__(name, g.clone()))
        return out

    conv1d = torch.nn.functional.conv1d
    monkeypatch.setattr(torch.nn.functional, 'conv1d', recording_conv1d)

    def run():
        conv1d_calls.clear()
        layer.load_state_dict(initial)
        layer.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_()
        u = state0.u.clone().requires_grad_()
        z = state0.z.clone().requires_grad_()
        out, new = layer(x, KCLAState(u, z))
        assert layer.last_implementation == 'compiled'
        torch.autograd.backward((out, new.u, new.z),
                                (grad_out, grad_u, torch.ones_like(new.z)))
        results = dict(out=out.detach(), u=new.u.detach(), z=new.z.detach())
        results.update(grad_x=x.grad, grad_u=u.grad, grad_z=z.grad)
        for name, p in layer.named_parameters():
            results[f'grad {name}'] = p.grad
        for name, buf in layer.named_buffers():
            results[name] = buf.clone()
        for entry in conv1d_calls:
            results.update(entry)
        return results

    results = at_each_thread_count(run)
    conv1d_weights = {
        f'grad {name}.weight'
        for name, m in layer.named_modules() if isinstance(m, torch.nn.Conv1d)
    }
    assert conv1d_weights == {
        'grad query_conv.weight', 'grad key_conv.weight',
        'grad state_key_conv.weight'
    }
    # Only the state's key conv runs in PyTorch.
    assert sum('grad_output' in name for name in results[0]) == 1
    assert_bitwise_equal(results, torch_reduced={'grad state_key_conv.weight'})
    # A dropped sample's output is its input; the seed drops some, not all.
    dropped = sum(results[0]['out'][n].equal(x0[n]) for n in range(3))
    assert dropped == 0 if drop_path == 0 else 0 < dropped < 3


def test_backbone_inference_does_not_depend_on_threads(ext):
    """A whole compiled backbone: the block tails fused into the kernels,
    the pooled-vector kernel and the branch kernels."""
    model = randomise_(
        KCLAResNet(
            depth=18,
            base_channels=16,
            head_dim=16,
            kcla_implementation='compiled')).eval()
    x = torch.rand(2, 3, 64, 48)

    def run():
        with torch.no_grad():
            return {f'stage {i}': y for i, y in enumerate(model(x))}

    assert_bitwise_equal(at_each_thread_count(run))


@requires_openmp_torch
def test_kernels_are_built_with_openmp(ext):
    """ATen's at::parallel_for is inlined as `#pragma omp parallel`, which
    only -fopenmp compiles into a call to the runtime: a build without it
    (as before issue 27) runs every kernel on one thread."""
    defined, undefined = dynamic_symbols(ext.__file__)
    # The reader reads: the module's own entry point is there.
    assert f'PyInit_{ext.__name__.rsplit(".", 1)[-1]}' in defined
    assert 'GOMP_parallel' in undefined, (
        f'{ext.__file__} calls no OpenMP runtime: its at::parallel_for runs '
        'serially (built without -fopenmp?)')
    assert {'omp_get_num_threads', 'omp_get_thread_num'} <= undefined


def mapped_openmp_runtimes():
    with open('/proc/self/maps', encoding='utf-8') as f:
        paths = {
            fields[5].strip()
            for fields in (line.split(None, 5) for line in f)
            if len(fields) == 6
        }
    return sorted(
        p for p in paths if OPENMP_RUNTIME.match(os.path.basename(p)))


@requires_openmp_torch
@pytest.mark.skipif(
    not os.path.exists('/proc/self/maps'), reason='needs Linux /proc')
def test_one_openmp_runtime_is_loaded(ext):
    """The kernels use the runtime torch loaded: two runtimes in one
    process would mean two thread pools, each sized by its own
    omp_set_num_threads, and oversubscribed cores."""
    torch.set_num_threads(2)  # conftest.py puts the count back
    x = torch.rand(2, 8, 5, 5)
    w, scale = torch.rand(2, 2) + 1, torch.rand(2, 2)
    kernel = torch.rand(8, 1, 3, 3)
    ext.branch_forward(x, None, w, scale, kernel, None, None, None, None, True,
                       1e-5, None, None, False, False)
    runtimes = mapped_openmp_runtimes()
    assert len(runtimes) == 1, runtimes
