"""The tracer: shapes in order, strides and views checked against torch's own tensors."""


import pytest
import torch
import torch.nn as nn

from mha_trace.core.attention import MultiHeadAttention
from mha_trace.core.tracer import ForwardFailed, trace


@pytest.fixture(scope="module")
def l04():
    """The L04 lecture's example: batch 2, seq 10, d_model 512, 8 heads."""
    torch.manual_seed(0)
    module = MultiHeadAttention(512, 8)
    x = torch.randn(2, 10, 512)
    with torch.no_grad():
        return module, x, trace(module, x)


def test_l04_shape_table_in_order(l04):
    _, _, t = l04
    got = [(s.op, s.shape) for s in t.steps]
    # the L04 table's rows, with the score matrix it leaves implicit
    assert got == [
        ("input", (2, 10, 512)),
        ("linear", (2, 10, 512)), ("view", (2, 10, 8, 64)), ("transpose", (2, 8, 10, 64)),
        ("linear", (2, 10, 512)), ("view", (2, 10, 8, 64)), ("transpose", (2, 8, 10, 64)),
        ("linear", (2, 10, 512)), ("view", (2, 10, 8, 64)), ("transpose", (2, 8, 10, 64)),
        ("transpose", (2, 8, 64, 10)), ("matmul", (2, 8, 10, 10)), ("div", (2, 8, 10, 10)),
        ("softmax", (2, 8, 10, 10)), ("matmul", (2, 8, 10, 64)),
        ("transpose", (2, 10, 8, 64)), ("contiguous", (2, 10, 8, 64)), ("view", (2, 10, 512)),
        ("linear", (2, 10, 512)),
    ]


def test_strides_and_contiguity_match_torch(l04):
    module, x, t = l04
    B, T = 2, 10
    with torch.no_grad():
        q = module.W_q(x)
        q4 = q.view(B, -1, 8, 64)
        qt = q4.transpose(1, 2)
        ctx = torch.randn(B, 8, T, 64).transpose(1, 2)
        copied = ctx.contiguous()
    expected = {1: q, 2: q4, 3: qt, 15: ctx, 16: copied, 17: copied.view(B, -1, 512)}
    for index, tensor in expected.items():
        step = t.steps[index]
        assert step.stride == tensor.stride(), index
        assert step.contiguous == tensor.is_contiguous(), index
    assert t.steps[3].contiguous is False and t.steps[16].contiguous is True


def test_views_allocate_nothing_and_copies_do(l04):
    _, _, t = l04
    for s in t.steps:
        if s.op in ("view", "transpose"):
            assert s.is_view and s.bytes == 0, s
        if s.op in ("linear", "matmul", "softmax", "div", "contiguous"):
            assert not s.is_view and s.bytes == 4 * torch.Size(s.shape).numel(), s


def test_chained_calls_are_split_into_their_own_parts(l04):
    _, _, t = l04
    texts = [s.text for s in t.steps[1:4]]
    assert texts == ["self.W_q(q)", ".view(B, -1, self.heads, self.d_k)", ".transpose(1, 2)"]
    assert {s.line for s in t.steps[1:4]} == {t.steps[1].line}
    assert [s.text for s in t.steps[15:18]] == [
        "context.transpose(1, 2)", ".contiguous()", ".view(B, -1, self.d_model)"]
    assert t.steps[12].text == "… / math.sqrt(self.d_k)"
    assert t.steps[1].source.startswith("Q = self.W_q(q).view(")


def test_contiguous_on_contiguous_tensor_is_a_view():
    class Twice(nn.Module):
        def forward(self, x):
            return x.contiguous().contiguous()

    t = trace(Twice(), torch.randn(2, 3))
    assert [s.is_view for s in t.steps[1:]] == [True, True]


def test_meta_device_at_gpt3_scale_allocates_nothing():
    with torch.device("meta"):
        module = MultiHeadAttention(12288, 96)
        x = torch.empty(1, 2048, 12288)
    t = trace(module, x)
    scores = t.steps[11]
    assert scores.op == "matmul" and scores.shape == (1, 96, 2048, 2048)
    assert scores.bytes == 96 * 2048 * 2048 * 4
    assert t.steps[16].op == "contiguous" and not t.steps[16].is_view
    assert all(s.device == "meta" for s in t.steps)


def test_tracer_detaches_and_leaves_module_alone():
    module = MultiHeadAttention(16, 4).train()
    trace(module, torch.randn(1, 3, 16))
    assert module.training
    assert torch.overrides._get_current_function_mode() is None
    with pytest.raises(ForwardFailed):
        trace(module, torch.randn(1, 3, 15))
    assert torch.overrides._get_current_function_mode() is None
    assert module.training and module.W_q.weight.device.type == "cpu"


def test_failure_names_the_line_op_and_input_shapes():
    module = MultiHeadAttention(16, 4)
    with pytest.raises(ForwardFailed) as info:
        trace(module, torch.randn(1, 3, 15))
    failure = info.value.trace.failure
    assert failure.op == "linear" and failure.text == "self.W_q(q)"
    assert (1, 3, 15) in failure.inputs
    assert "shapes cannot be multiplied" in failure.message
    assert [s.op for s in info.value.trace.steps] == ["input"]


def test_filters_non_tensor_results():
    class Sizes(nn.Module):
        def forward(self, x):
            B, T = x.size(0), x.shape[1]
            return x.view(B * T, -1) * x.dim()

    t = trace(Sizes(), torch.randn(2, 3, 4))
    assert [s.op for s in t.steps] == ["input", "view", "mul"]


class _TracesAGraph(nn.Module):
    """Attention whose forward traces part of itself for a graph (torch.jit.trace): the ops run
    while tracing hold tensors for sizes, and are not forward's own steps."""

    def forward(self, q, k, v):
        import torch.nn.functional as F

        attend = torch.jit.trace(lambda a, b, c: F.scaled_dot_product_attention(a, b, c),
                                 (q, k, v), check_trace=False)
        return attend(q, k, v) * 2


def test_ops_run_while_a_graph_is_traced_are_left_out_and_the_rest_recorded():
    q = torch.randn(1, 2, 3, 4)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.trace is deprecated
        t = trace(_TracesAGraph(), q, q, q)
    assert [(s.op, s.shape, type(s.bytes)) for s in t.steps if s.op != "input"] == [
        ("mul", (1, 2, 3, 4), int)]
    torch.testing.assert_close(t.output, torch.nn.functional.scaled_dot_product_attention(q, q, q) * 2)
