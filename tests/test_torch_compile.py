"""KCLA-ResNet under torch.compile: the default 'auto' and 'recompute'
take the fused path there (the compiled kernels' calls and the recompute
tape's side effects would each break the graph), so an eval forward and a
train step trace as whole graphs, and the compiled model computes what the
eager one does."""
import pytest
import torch

from helpers import assert_close_to_max, small_kcla

IMPLEMENTATIONS = ['auto', 'recompute', 'fused']

# torch 2.1's dynamo (the official stack) stops inside the layer's
# dispatch with an internal error; from torch 2.3 (torch.compiler's
# is_compiling) the dispatch folds to the fused path.
pytestmark = pytest.mark.skipif(
    not hasattr(torch.compiler, 'is_compiling'),
    reason=f'torch.compile of KCLA layers needs torch >= 2.3 '
    f'(torch.compiler.is_compiling); this is {torch.__version__}')


def train_loss(model, x):
    return sum(out.sum() for out in model(x))


@pytest.mark.parametrize('implementation', IMPLEMENTATIONS)
def test_no_graph_breaks(implementation):
    model = small_kcla(implementation)
    x = torch.rand(2, 3, 64, 64)
    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(model.eval())(x)
    assert explained.graph_break_count == 0, explained.break_reasons
    torch._dynamo.reset()
    model.train()
    explained = torch._dynamo.explain(lambda t: train_loss(model, t))(x)
    assert explained.graph_break_count == 0, explained.break_reasons
    torch._dynamo.reset()


@pytest.mark.parametrize('implementation', IMPLEMENTATIONS)
def test_compiled_train_step_is_eager(implementation):
    """aot_eager: dynamo and AOT autograd as inductor gets them, without
    code generation (minutes on a small CPU); gradients and BN statistics
    of a train step equal eager's, in float64 (eager 'auto' runs the
    kernels, whose fp32 sums round differently from the fused path)."""
    eager = small_kcla(implementation).double().train()
    model = small_kcla(implementation).double().train()
    model.load_state_dict(eager.state_dict())
    x = torch.rand(2, 3, 64, 64, dtype=torch.float64)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend='aot_eager')
    train_loss(eager, x).backward()
    train_loss(compiled, x).backward()
    torch._dynamo.reset()
    for (name, got), want in zip(model.named_parameters(), eager.parameters()):
        assert_close_to_max(got.grad, want.grad, 1e-9)
    for got, want in zip(model.buffers(), eager.buffers()):
        assert_close_to_max(got.double(), want.double(), 1e-9)
    layers = [m for m in model.modules() if hasattr(m, 'params')]
    assert {m.last_implementation for m in layers} == {'fused'}
