"""torchao's own quantization flow, unmodified, served by torchao_kernels.

PyPI torchao (0.18) ships no CPU kernel library for its "opaque_torchao_*"
packing formats; `import torchao_kernels` registers torchao's per-bit-width ops
(torch.ops.torchao._pack_8bit_act_{b}bit_weight / _linear_8bit_act_{b}bit_weight),
so torchao.quantization.quantize_ with Int8DynamicActivationIntxWeightConfig
runs on our kernels.

Tolerance: the opaque (packed) model must match the same model quantized with
intx_packing_format="unpacked_to_int8" (torchao's unpacked reference path) with
SQNR > 30 dB, computed by torchao.quantization.utils.compute_error. That is the
bound torchao's own test uses for exactly this comparison: pytorch/ao
test/quantization/quantize_/workflows/intx/test_intx_opaque_tensor.py,
TestIntxOpaqueTensor.test_accuracy (`self.assertTrue(sqnr > 30, ...)`, every
opaque format against UNPACKED_TO_INT8, float32 and bfloat16 models). The test
sources are not shipped in the torchao wheel; they were read from the
repository.
"""
import copy
import json
import os
import subprocess
import sys
import tempfile
import textwrap

import pytest
import torch

import torchao_kernels as tk

torchao = pytest.importorskip("torchao")

from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_  # noqa: E402
from torchao.quantization.granularity import PerAxis, PerGroup  # noqa: E402
from torchao.quantization.quant_api import MappingType  # noqa: E402
from torchao.quantization.quantize_.workflows.intx.intx_opaque_tensor import (  # noqa: E402
    IntxOpaqueTensor,
)
from torchao.quantization.utils import compute_error  # noqa: E402

SQNR_MIN_DB = 30.0  # torchao's bound, see the module docstring
K, N = 256, 131  # odd n exercises the partial output blocks
MS = (1, 3, 37)  # GEMV, torchao's m=3, GEMM with a row tail
INT_DTYPES = {b: getattr(torch, f"int{b}") for b in range(1, 9)}
MAPPINGS = {"sym": MappingType.SYMMETRIC, "asym": MappingType.ASYMMETRIC}
GRANULARITIES = {"group32": PerGroup(32), "axis0": PerAxis(0)}


@pytest.fixture(autouse=True)
def default_overrides():
    tk.set_overrides()
    yield
    tk.set_overrides()


def _model(bias, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(K, K, bias=bias), torch.nn.ReLU(), torch.nn.Linear(K, N, bias=bias)
    ).to(dtype)


def _config(bits, mapping, granularity, packing):
    return Int8DynamicActivationIntxWeightConfig(
        weight_dtype=INT_DTYPES[bits],
        weight_granularity=granularity,
        weight_mapping_type=mapping,
        intx_packing_format=packing,
    )


def _quantized_pair(model, bits, mapping, granularity, packing="opaque_torchao_auto"):
    packed = copy.deepcopy(model)
    quantize_(packed, _config(bits, mapping, granularity, packing))
    reference = copy.deepcopy(model)
    quantize_(reference, _config(bits, mapping, granularity, "unpacked_to_int8"))
    return packed, reference


def _sqnr(result, expected):
    return float(compute_error(result.float(), expected.float()))


def _assert_matches(result, expected, what=""):
    if not expected.any():
        # SQNR is 0/0 here: torchao's symmetric int1 rounds every weight to 0,
        # so without a bias both paths must give exactly zero.
        assert torch.equal(result, expected), what
        return
    sqnr = _sqnr(result, expected)
    assert sqnr > SQNR_MIN_DB, f"{what}: SQNR {sqnr:.1f} dB"


def _check_served_by_torchao_kernels(model, bits, zeros, bias):
    for layer in (model[0], model[2]):
        w = layer.weight
        assert isinstance(w, IntxOpaqueTensor), type(w)
        info = tk.packed_info(w.packed_weights)  # our self-describing header
        assert (info["bits"], info["n"], info["k"]) == (bits, w.shape[0], w.shape[1])
        assert info["has_zeros"] == zeros == w.packed_weights_has_zeros
        assert info["has_bias"] == bias == w.packed_weights_has_bias
        assert info["format"] == tk.best_format(bits, zeros=zeros, bias=bias)


def test_torchao_sees_the_kernel_library():
    from torchao.quantization.quantize_.workflows.intx.intx_opaque_tensor import (
        _is_kernel_library_loaded,
    )

    assert tk.torchao_compat_status() == "registered"
    assert _is_kernel_library_loaded()
    for b in range(1, 9):
        assert hasattr(torch.ops.torchao, f"_pack_8bit_act_{b}bit_weight")
        assert hasattr(torch.ops.torchao, f"_linear_8bit_act_{b}bit_weight")


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("granularity", list(GRANULARITIES), ids=list(GRANULARITIES))
@pytest.mark.parametrize("mapping", list(MAPPINGS), ids=list(MAPPINGS))
@pytest.mark.parametrize("bits", range(1, 9), ids=[f"int{b}" for b in range(1, 9)])
def test_opaque_torchao_auto_matches_unpacked_reference(bits, mapping, granularity, bias):
    model = _model(bias, seed=bits)
    packed, reference = _quantized_pair(model, bits, MAPPINGS[mapping], GRANULARITIES[granularity])
    _check_served_by_torchao_kernels(packed, bits, zeros=mapping == "asym", bias=bias)
    tk.reset_stats()
    with torch.no_grad():
        for m in MS:
            x = torch.randn(m, K, generator=torch.Generator().manual_seed(m))
            result, expected = packed(x), reference(x)
            assert result.shape == expected.shape == (m, N)
            _assert_matches(result, expected, f"m={m}")
    assert sum(tk.stats().values()) == 2 * len(MS), tk.stats()  # both layers, every m


@pytest.mark.parametrize("mapping", list(MAPPINGS), ids=list(MAPPINGS))
@pytest.mark.parametrize("bits", [2, 4, 8], ids=["int2", "int4", "int8"])
def test_bfloat16_model_matches_unpacked_reference(bits, mapping):
    model = _model(bias=True, dtype=torch.bfloat16, seed=bits)
    packed, reference = _quantized_pair(model, bits, MAPPINGS[mapping], PerGroup(32))
    with torch.no_grad():
        for m in MS:
            x = torch.randn(m, K).to(torch.bfloat16)
            result, expected = packed(x), reference(x)
            assert result.dtype == torch.bfloat16
            _assert_matches(result, expected, f"m={m}")
    # torchao hands the scales over as float32, but on a bfloat16 model they are
    # bfloat16 values: stored as bfloat16 (2 bytes each instead of 4)
    for layer in (packed[0], packed[2]):
        assert tk.packed_info(layer.weight.packed_weights)["scale_dtype"] == "bfloat16"


@pytest.mark.parametrize("packing,bits,mapping", [
    ("opaque_torchao_lowbit", 3, "asym"),  # torchao's target "universal"
    ("opaque_torchao_lowbit", 6, "sym"),
    ("opaque_torchao_kleidiai", 4, "sym"),  # torchao's target "kleidiai": int4 symmetric only
])
def test_other_torchao_opaque_formats(packing, bits, mapping):
    model = _model(bias=True, seed=3)
    packed, reference = _quantized_pair(model, bits, MAPPINGS[mapping], PerGroup(32), packing)
    _check_served_by_torchao_kernels(packed, bits, zeros=mapping == "asym", bias=True)
    with torch.no_grad():
        x = torch.randn(3, K)
        _assert_matches(packed(x), reference(x))


def test_leading_dims_and_state_dict_round_trip():
    model = _model(bias=True)
    packed, reference = _quantized_pair(model, 4, MappingType.ASYMMETRIC, PerGroup(64))
    x = torch.randn(2, 5, K)
    with torch.no_grad():
        y = packed(x)
        assert y.shape == (2, 5, N)
        _assert_matches(y, reference(x))
        assert torch.equal(packed(x[1, 2]), y[1, 2])  # 1-D input, batch invariant
    with tempfile.TemporaryDirectory() as d:
        torch.save(packed.state_dict(), f"{d}/model.pt")
        state = torch.load(f"{d}/model.pt", map_location="cpu", weights_only=True)
    fresh = _model(bias=False, seed=99)  # the bias lives in the packed weights
    fresh.load_state_dict(state, assign=True)
    with torch.no_grad():
        assert torch.equal(fresh(x), y)


def test_torch_compile_fullgraph_of_a_torchao_quantized_model():
    model = _model(bias=True)
    quantize_(model, _config(3, MappingType.ASYMMETRIC, PerAxis(0), "opaque_torchao_auto"))
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    with torch.no_grad():
        for shape in [(5, K), (1, K), (64, K), (2, 3, K)]:
            x = torch.randn(*shape)
            assert torch.equal(compiled(x), model(x)), shape


_IMPORT_ORDER_SCRIPT = textwrap.dedent("""
    {imports}
    import copy, json, torch
    from torchao.quantization import quantize_, Int8DynamicActivationIntxWeightConfig
    from torchao.quantization.granularity import PerGroup, PerAxis
    from torchao.quantization.quant_api import MappingType
    from torchao.quantization.utils import compute_error
    out = {{"status": torchao_kernels.torchao_compat_status(), "sqnr": {{}}}}
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 64), torch.nn.Linear(64, 33, bias=False))
    x = torch.randn(3, 128)
    for bits, mapping, gran in [(4, MappingType.SYMMETRIC, PerGroup(32)),
                                (2, MappingType.ASYMMETRIC, PerAxis(0))]:
        models = {{}}
        for fmt in ("opaque_torchao_auto", "unpacked_to_int8"):
            models[fmt] = copy.deepcopy(model)
            quantize_(models[fmt], Int8DynamicActivationIntxWeightConfig(
                weight_dtype=getattr(torch, f"int{{bits}}"), weight_granularity=gran,
                weight_mapping_type=mapping, intx_packing_format=fmt))
        torchao_kernels.reset_stats()
        with torch.no_grad():
            y = models["opaque_torchao_auto"](x)
            ref = models["unpacked_to_int8"](x)
        out["sqnr"][str(bits)] = float(compute_error(y, ref))
        out["stats_calls_" + str(bits)] = sum(torchao_kernels.stats().values())
    # the per-bit-width op also has a Meta kernel (fake tensors, compile, export)
    w = models["opaque_torchao_auto"][0].weight
    meta = torch.ops.torchao._linear_8bit_act_2bit_weight(
        torch.empty(3, 128, device="meta"), w.packed_weights.to("meta"), 128, 64, 128)
    out["meta_shape"] = list(meta.shape)
    # whatever the import order, the per-bit-width names keep this package's
    # shape rules under fake tensors: 3-D activations, 2-D indices (torchao's
    # own Meta kernels take 2-D / 1-D only)
    meta3 = torch.ops.torchao._linear_8bit_act_2bit_weight(
        torch.empty(2, 3, 128, device="meta"), w.packed_weights.to("meta"), 128, 64, 128)
    out["meta_shape_3d"] = list(meta3.shape)
    e = torchao_kernels.QuantizedEmbedding.from_embedding(torch.nn.Embedding(20, 64), bits=4, group_size=32)
    meta_e = torch.ops.torchao._shared_embedding_4bit(e.packed_weights.to("meta"), 32, 20, 64,
                                                       torch.empty(2, 5, dtype=torch.long, device="meta"))
    out["meta_shape_emb"] = list(meta_e.shape)
    print("RESULT " + json.dumps(out))
""")


@pytest.mark.parametrize("imports", [
    "import torchao; import torchao_kernels",
    "import torchao_kernels; import torchao",
], ids=["torchao_first", "torchao_kernels_first"])
def test_import_orders(imports):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHAO_KERNELS_") or k == "TORCHAO_KERNELS_TUNING"}
    p = subprocess.run([sys.executable, "-c", _IMPORT_ORDER_SCRIPT.format(imports=imports)],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"rc={p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, p.stdout + p.stderr
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["status"] == "registered"
    for bits, sqnr in out["sqnr"].items():
        assert sqnr > SQNR_MIN_DB, (bits, sqnr)
        assert out["stats_calls_" + bits] == 2, out
    assert out["meta_shape"] == [3, 64]
    assert out["meta_shape_3d"] == [2, 3, 64] and out["meta_shape_emb"] == [2, 5, 64]
