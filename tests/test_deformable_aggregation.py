"""The implementations of the deformable aggregation compute the same sum (values and gradients), and ``auto``
picks between two of them where it runs."""

from __future__ import annotations

import importlib

import pytest
import torch

from drivebench.models.ops import deformable_aggregation, masked_point_softmax
from drivebench.models.ops.deformable_aggregation import corner_gather_aggregation

OP_MODULE = importlib.import_module("drivebench.models.ops.deformable_aggregation")  # the function shadows the name


@pytest.fixture(scope="module", autouse=True)
def single_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _inputs(seed: int = 0, b: int = 2, q: int = 7, p: int = 3, n: int = 2, c: int = 8, g: int = 2,
            sizes=((6, 10), (3, 5)), dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    features = [torch.randn(b, n, c, h, w, generator=gen, dtype=dtype, requires_grad=True) for h, w in sizes]
    # some keypoints leave the image (zero padding) and some sit near its border
    points = (torch.rand(b, q, p, n, 2, generator=gen, dtype=dtype) * 1.3 - 0.15).requires_grad_()
    logits = torch.randn(b, q, p, n, len(sizes), g, generator=gen, dtype=dtype)
    visible = torch.rand(b, q, p, n, generator=gen) > 0.3
    weights = masked_point_softmax(logits, visible).requires_grad_()
    return features, points, weights


def _value_and_grads(fn, features, points, weights, upstream):
    out = fn(features, points, weights)
    grads = torch.autograd.grad((out * upstream).sum(), [*features, points, weights])
    return out, grads


@pytest.mark.parametrize("impl", ["chunked", "corner_gather"])
def test_implementations_match_grid_sample_values_and_gradients(impl):
    features, points, weights = _inputs()
    upstream = torch.randn(2, 7, 8, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    ref, ref_grads = _value_and_grads(lambda *a: deformable_aggregation(*a, impl="grid_sample"),
                                      features, points, weights, upstream)
    if impl == "chunked":  # 3 queries per chunk over 7 queries: chunks of 3, 3 and 1
        per_query = 2 * 2 * 8 * 3 * 2
        fn = lambda *a: deformable_aggregation(*a, impl="chunked", chunk_elements=3 * per_query)  # noqa: E731
    else:
        fn = corner_gather_aggregation
    out, grads = _value_and_grads(fn, features, points, weights, upstream)
    torch.testing.assert_close(out, ref)
    assert ref.abs().sum() > 0
    for name, got, want in zip(("level 0", "level 1", "points", "weights"), grads[:2] + grads[2:], ref_grads):
        assert want.abs().sum() > 0, name
        torch.testing.assert_close(got, want, msg=lambda m: f"grad of {name}: {m}")


def test_chunked_keeps_only_one_chunk_of_samples_for_backward():
    """Saved-for-backward bytes: grid_sample keeps every sample; chunked keeps its inputs (recomputes in backward)."""
    features, points, weights = _inputs(q=64, p=4, c=16, sizes=((8, 12),), dtype=torch.float32)
    sample_bytes = 2 * 2 * 16 * 64 * 4 * 4  # B * N * C * Q * P floats

    def saved_bytes(impl: str) -> int:
        seen: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            deformable_aggregation(features, points, weights, impl=impl, chunk_elements=sample_bytes // 4 // 8)
        inputs = {t.untyped_storage().data_ptr() for t in (*features, points, weights)}
        return sum(n for ptr, n in seen.items() if ptr not in inputs)

    dense, chunked = saved_bytes("grid_sample"), saved_bytes("chunked")
    assert dense >= sample_bytes  # the (B*N, C, Q, P) samples themselves
    assert chunked < sample_bytes / 8


def test_compiled_matches_grid_sample():
    features, points, weights = _inputs(dtype=torch.float32)
    upstream = torch.randn(2, 7, 8, generator=torch.Generator().manual_seed(9))
    ref, ref_grads = _value_and_grads(lambda *a: deformable_aggregation(*a, impl="grid_sample"),
                                      features, points, weights, upstream)
    out, grads = _value_and_grads(lambda *a: deformable_aggregation(*a, impl="compiled"),
                                  features, points, weights, upstream)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_grid_sample_keeps_float32_keypoints_with_bf16_features():
    """Under autocast the features are bf16 and the keypoints float32 (projected outside autocast): the sampling
    positions must not be rounded to bf16 (up to 1/512 of the map, 1.5% rms of the output; upstream's op takes
    float32 locations). Its error against float64 stays at the corner gathers' (which keep float32 positions)."""
    features, points, weights = _inputs(b=1, q=60, p=4, n=2, c=16, sizes=((32, 88), (16, 44)), dtype=torch.float32)
    features = [f.detach() for f in features]
    points, weights = points.detach(), weights.detach()
    ref = corner_gather_aggregation([f.double() for f in features], points.double(), weights.double())
    low = [f.bfloat16() for f in features]

    def rms_error(out: torch.Tensor) -> float:
        return (out.double() - ref).pow(2).mean().sqrt().item()

    out = deformable_aggregation(low, points, weights, impl="grid_sample")
    assert out.dtype == torch.bfloat16
    gathers = rms_error(corner_gather_aggregation(low, points, weights))
    assert 0 < rms_error(out) < 2 * gathers, (rms_error(out), gathers)


def test_unknown_impl_is_refused():
    features, points, weights = _inputs()
    with pytest.raises(ValueError, match="valid choices: grid_sample, chunked, compiled, auto"):
        deformable_aggregation(features, points, weights, impl="triton")


def test_compiled_inside_a_compiled_region_traces_into_its_graph():
    """A compile unit around the op (GaussianFormer's ``compile_scope=encoder``) traces the op into its own graph
    and never compiles it apart (torch 2.11 broke the graph there, once per block, on the H100 in b57):
    ``fullgraph=True`` raises on any break, and the op's own compiled function is not even created."""
    features, points, weights = _inputs(dtype=torch.float32)
    region = torch.compile(lambda f, p, w: deformable_aggregation(f, p, w, impl="compiled") * 2.0,
                           backend="aot_eager", fullgraph=True)
    torch._dynamo.reset()
    OP_MODULE._COMPILED.clear()
    out = region(features, points, weights)
    assert OP_MODULE._COMPILED == {}
    ref = deformable_aggregation(features, points, weights, impl="grid_sample") * 2.0
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


def op_recorder(ops: set[str]):
    """A torch.compile backend that runs Dynamo's graphs as captured and adds the ops they call to ``ops``
    (a checkpointed region's too: it is a subgraph of its own)."""

    def record(gm: torch.fx.GraphModule, _inputs):
        for sub in gm.modules():
            if isinstance(sub, torch.fx.GraphModule):
                ops.update(str(n.target) for n in sub.graph.nodes if n.op == "call_function")
        return gm.forward

    return record


def _graph_ops(fn, *args) -> tuple[torch.Tensor, set[str]]:
    """``fn`` compiled as one graph (``fullgraph``: a break raises); its output and the ops in its graph."""
    ops: set[str] = set()
    torch._dynamo.reset()
    return torch.compile(fn, backend=op_recorder(ops), fullgraph=True)(*args), ops


def test_auto_runs_grid_sample_eagerly_and_corner_gathers_inside_a_compiled_region():
    """``auto`` (GaussianFormer's default): the eager op is ``grid_sample``'s, value for value; traced inside a
    compile unit it is the corner gathers, with no ``grid_sample`` left in the graph and no function of its own."""
    features, points, weights = _inputs(dtype=torch.float32)
    ref = deformable_aggregation(features, points, weights, impl="grid_sample")
    assert torch.equal(deformable_aggregation(features, points, weights, impl="auto"), ref)
    OP_MODULE._COMPILED.clear()
    out, ops = _graph_ops(lambda f, p, w: deformable_aggregation(f, p, w, impl="auto"), features, points, weights)
    assert OP_MODULE._COMPILED == {}
    assert not any("grid_sample" in op for op in ops), ops
    assert any("floor" in op for op in ops), ops  # the corners of each keypoint, then gathers (getitem)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    _, grid_ops = _graph_ops(lambda f, p, w: deformable_aggregation(f, p, w, impl="grid_sample"),
                             features, points, weights)
    assert any("grid_sample" in op for op in grid_ops), grid_ops  # what the check above would have seen


def test_unknown_model_aggregation_names_auto_among_the_choices():
    from drivebench.models import create_model

    with pytest.raises(ValueError, match="aggregation='fast' is not valid; choose one of: grid_sample, chunked, "
                                         "compiled, auto"):
        create_model("gaussianformer", "test", aggregation="fast")
