"""ExecuTorch: models quantized with torchao_kernels (or torchao's quantize_ flow)
exported to .pte and run with executorch.runtime on libtorchao_kernels_executorch.so.

The ExecuTorch kernels call the same op body (ops::linear) as the torch
extension, so every torchao op in a .pte gives the eager result bit for bit
(torch.equal). A quantized MLP whose other ops are exact in both runtimes (ReLU)
is compared end to end. In the transformer block, ExecuTorch's own float
kernels (layer norm, softmax, bmm, SiLU) round differently from ATen's in the
last bits, so the block's output is compared with a tolerance and each
quantized linear inside it is checked bit for bit: the block also returns every
linear's input and output, and eager recomputes each linear from the input
ExecuTorch fed it.

Needs `executorch` (pip install executorch==1.5.1) and the kernel library
(bash tools/build_executorch.sh; tools/install.sh does both).
"""
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchao_kernels as tk

pytest.importorskip("executorch")
from torchao_kernels import executorch as tke  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNNER = os.path.join(REPO, "build", "executorch", "tk_pte_runner")
XBIT_OUT = "torchao::linear_8bit_act_xbit_weight.out"


@pytest.fixture(scope="module", autouse=True)
def kernels():
    try:
        path = tke.library_path()
    except FileNotFoundError as e:
        pytest.fail(f"executorch is installed but the kernel library is not built: {e}")
    assert tke.load_kernels() == path
    return path


def mlp(k=64, hidden=160, n=48, bias=True, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(k, hidden, bias=bias), nn.ReLU(), nn.Linear(hidden, n, bias=bias))


def batch_dim(max_=64):
    return ({0: torch.export.Dim("batch", min=1, max=max_)},)


def run(method, *inputs):
    return method.execute(list(inputs))


# ---------------------------------------------------------------- loading


def test_load_kernels_is_idempotent_and_registers_every_op(kernels):
    assert tke.load_kernels() == kernels
    assert tke.load_kernels(kernels) == kernels
    assert tke.is_loaded()
    from executorch.extension.pybindings import portable_lib

    registered = set(portable_lib._get_operator_names())
    assert set(tke.OPS) <= registered


def test_library_registers_exactly_the_op_list(kernels):
    """The library's own list (torchao_kernels_executorch_ops) is the extension's op list,
    and every op in it has the ATen schema of the same name."""
    import ctypes

    fn = ctypes.CDLL(kernels).torchao_kernels_executorch_ops
    fn.restype = ctypes.c_char_p
    names = fn().decode().split(",")
    assert names == list(tke.OPS)
    assert len(names) == len(set(names)) == 27
    for name in names:
        ns, op = name.split("::")
        base, overload = op.split(".")
        if base.startswith("_") and tk.torchao_compat_status(
                "embedding" if "embedding" in base else "linear") != "registered":
            continue
        schema = str(getattr(getattr(torch.ops, ns), base).out._schema)
        assert schema.startswith(f"{name}(") and schema.endswith("-> Tensor(a!)"), schema


def _python(code, **env):
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
        timeout=120, env={**os.environ, **env},
    )


def test_second_copy_of_the_library_is_not_registered_again(kernels, tmp_path):
    # ExecuTorch aborts the process on a second registration of an op; load_kernels
    # must notice ops that are already registered, whoever loaded them.
    copy_path = str(tmp_path / "libtorchao_kernels_executorch_copy.so")
    shutil.copy(kernels, copy_path)
    r = _python(
        f"""
        import ctypes
        import torchao_kernels
        from torchao_kernels import executorch as tke
        ctypes.CDLL({copy_path!r})                  # someone else loaded a copy first
        print("loaded", tke.load_kernels())          # must not load the packaged one too
        tke._lib_path = None                         # a fresh module state (as after a reload)
        print("again", tke.load_kernels({kernels!r}))
        """
    )
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith(("loaded", "again"))]
    assert lines == [f"loaded {copy_path}", f"again {copy_path}"], r.stdout


def test_foreign_registration_is_refused_not_aborted(kernels, tmp_path):
    # Another library (here: a copy under a foreign name) already serves our op names.
    foreign = str(tmp_path / "libforeign_kernels.so")
    shutil.copy(kernels, foreign)
    r = _python(
        f"""
        import ctypes
        from torchao_kernels import executorch as tke
        ctypes.CDLL({foreign!r})
        try:
            tke.load_kernels()
        except RuntimeError as e:
            print("refused:", e)
        print("mapped:", tke._mapped_copies())
        """
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "refused: another library already registered" in r.stdout, r.stdout
    assert "mapped: []" in r.stdout  # the packaged library was never loaded next to it


def test_kernel_library_selects_like_the_torch_extension():
    # Same registry, same selection policy, same ISA detection (each library has its own cpuinfo).
    et, aten = tke.kernels_info(), tk.info()
    assert [k["name"] for k in et["kernels"]] == [k["name"] for k in aten["kernels"]]
    assert et["cpu"]["isa"] == aten["cpu"]["isa"]
    assert et["selection"] == aten["selection"]


def test_set_overrides_reach_the_kernel_library(tmp_path):
    """tk.set_overrides() / tk.overrides() steer the kernel library's own selection
    layer too: a program run inside `with tk.overrides(max_isa="reference")` is
    served by the reference kernel, and by the usual kernel again after it."""
    model = mlp()
    tk.quantize_(model, bits=4, group_size=32, target="n16k4")
    # the exported program's bytes are a temporary: load() keeps them alive
    method = tke.load(tke.export(model, (torch.randn(3, 64),)).buffer)
    x = torch.randn(3, 64)
    (want,) = run(method, x)
    ref_kernel = next(k["name"] for k in tk.info()["kernels"]
                      if k["isa"] == "scalar" and k["format"] == "n16k4" and k["op"] == "linear")
    with tk.overrides(max_isa="reference"):
        assert tke.kernels_info()["selection"] == tk.info()["selection"]
        before = tke.kernels_stats().get(ref_kernel, 0)
        (got,) = run(method, x)
        assert tke.kernels_stats().get(ref_kernel, 0) - before == 2  # both linears
        assert torch.equal(got, want)  # bit-exact whatever the kernel
    assert tke.kernels_info()["selection"] == tk.info()["selection"]
    before = tke.kernels_stats().get(ref_kernel, 0)
    run(method, x)
    assert tke.kernels_stats().get(ref_kernel, 0) == before
    with pytest.raises(ValueError, match="max_isa"):
        tk.set_overrides(max_isa="bogus")


def test_tuning_table_reaches_the_kernel_library(tmp_path):
    """tk.set_tuning() steers the kernel library's selection layer too: a table
    whose every class of the program names the reference kernel makes it serve
    the program, bit-exact, and disabling the table restores the usual kernel."""
    import json as _json
    model = mlp()
    tk.quantize_(model, bits=4, group_size=32, target="n16k4")
    method = tke.load(tke.export(model, (torch.randn(3, 64),)).buffer)
    x = torch.randn(3, 64)
    (want,) = run(method, x)
    ref_kernel = next(k["name"] for k in tk.info()["kernels"]
                      if k["isa"] == "scalar" and k["format"] == "n16k4" and k["op"] == "linear")
    st = tk.tuning_status()
    entries = {f"linear/n16k4/b4/z{z}/bias{b}/m3/{r}/{rows}/short-groups/t{t}/c0":
               {"winner": ref_kernel, "times_us": {ref_kernel: 1.0}}
               for z in (0, 1) for b in (0, 1) for r in ("l2", "llc", "dram")
               for rows in ("short-rows", "medium-rows", "long-rows") for t in ("1", "2", "3-4", "5+")}
    path = tmp_path / "table.json"
    path.write_text(_json.dumps({"schema": "torchao_kernels.tuning", "version": 1, "cpu_signature": st["cpu_signature"],
                                 "kernel_set": st["kernel_set"], "entries": entries}))
    try:
        tk.set_tuning(path)
        before = tke.kernels_stats().get(ref_kernel, 0)
        (got,) = run(method, x)
        assert tke.kernels_stats().get(ref_kernel, 0) - before == 2  # both linears
        assert torch.equal(got, want)
        assert tke.kernels_info()["tuning"]["path"] == str(path)
    finally:
        tk.set_tuning(False)
    before = tke.kernels_stats().get(ref_kernel, 0)
    run(method, x)
    assert tke.kernels_stats().get(ref_kernel, 0) == before


# ---------------------------------------------------------------- quantized MLP


@pytest.mark.parametrize(
    "bits,zeros,target,scale_dtype",
    [(4, False, None, torch.float32), (2, True, None, torch.float32), (8, False, None, torch.float32),
     (3, True, "n1k4", torch.float32), (4, True, None, torch.bfloat16)],
    ids=["4bit", "2bit-zeros", "8bit", "3bit-zeros-n1k4", "4bit-zeros-bf16scales"],
)
def test_mlp_dynamic_batch_bit_exact(bits, zeros, target, scale_dtype, tmp_path):
    model = mlp()
    tk.quantize_(model, bits=bits, group_size=32, has_zeros=zeros, target=target, scale_dtype=scale_dtype)
    path = tmp_path / "mlp.pte"
    program = tke.export(model, (torch.randn(4, 64),), path, dynamic_shapes=batch_dim())
    assert XBIT_OUT in tke.operators(program)
    method = tke.load(path)
    before = sum(tke.kernels_stats().values())
    for m in (1, 3, 4, 17, 64):
        x = torch.randn(m, 64)
        (y,) = run(method, x)
        assert y.shape == (m, 48)
        assert torch.equal(y, model(x)), f"m={m}"
    assert sum(tke.kernels_stats().values()) - before == 2 * 5  # two linears, five calls


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mlp_from_bytes_half_precision(dtype):
    model = mlp(bias=False).to(dtype)
    tk.quantize_(model, bits=4, group_size=32)
    program = tke.export(model, (torch.randn(5, 64, dtype=dtype),))
    method = tke.load(program.buffer)
    for seed in (1, 2):  # static shape (5, 64)
        x = torch.randn(5, 64, generator=torch.Generator().manual_seed(seed)).to(dtype)
        (y,) = run(method, x)
        assert y.dtype == dtype and torch.equal(y, model(x))


def test_torchao_quantize_flow_mlp_bit_exact(tmp_path):
    if tk.torchao_compat_status() != "registered":
        pytest.skip(tk.torchao_compat_status())
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.quantization.quant_api import MappingType

    model = mlp()
    quantize_(model, Int8DynamicActivationIntxWeightConfig(
        weight_dtype=torch.int4, weight_granularity=PerGroup(32),
        intx_packing_format="opaque_torchao_auto"), filter_fn=lambda m, fqn: fqn == "0")
    quantize_(model, Int8DynamicActivationIntxWeightConfig(
        weight_dtype=torch.int6, weight_granularity=PerAxis(0), weight_mapping_type=MappingType.ASYMMETRIC,
        intx_packing_format="opaque_torchao_auto"), filter_fn=lambda m, fqn: fqn == "2")
    path = tmp_path / "torchao_mlp.pte"
    program = tke.export(model, (torch.randn(4, 64),), path, dynamic_shapes=batch_dim())
    ops = tke.operators(program)
    assert "torchao::_linear_8bit_act_4bit_weight.out" in ops
    assert "torchao::_linear_8bit_act_6bit_weight.out" in ops
    method = tke.load(path)
    for m in (1, 4, 33):
        x = torch.randn(m, 64)
        assert torch.equal(run(method, x)[0], model(x)), f"m={m}"


# ---------------------------------------------------------------- transformer block


class Taps(nn.Module):
    """Wraps a linear layer and records (input, output) of each call in `sink`."""

    def __init__(self, inner, sink):
        super().__init__()
        self.inner = inner
        self.sink = sink

    def forward(self, x):
        y = self.inner(x)
        self.sink.append((x, y))
        return y


class Block(nn.Module):
    """Pre-norm transformer block: causal multi-head attention and a gated SiLU MLP."""

    def __init__(self, dim=64, heads=4, hidden=128):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.norm2 = nn.RMSNorm(dim, eps=1e-6)
        self.gate, self.up = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        h = self.norm1(x)
        q, k, v = (p(h).view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for p in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class WithTaps(nn.Module):
    """Returns (output, in_0, out_0, in_1, out_1, ...) over the block's linear calls."""

    def __init__(self, block):
        super().__init__()
        self.sink = []
        self.block = block
        for name in ("q", "k", "v", "o", "gate", "up", "down"):
            setattr(block, name, Taps(getattr(block, name), self.sink))

    def forward(self, x):
        self.sink.clear()
        y = self.block(x)
        return (y,) + tuple(t for pair in self.sink for t in pair)


def quantize_block(block, flow):
    if flow == "torchao_kernels":
        tk.quantize_(block, bits=4, group_size=32)
        return
    if tk.torchao_compat_status() != "registered":
        pytest.skip(tk.torchao_compat_status())
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.quantization.granularity import PerGroup

    quantize_(block, Int8DynamicActivationIntxWeightConfig(
        weight_dtype=torch.int4, weight_granularity=PerGroup(32),
        intx_packing_format="opaque_torchao_auto"))


@pytest.mark.parametrize("flow", ["torchao_kernels", "torchao"])
def test_transformer_block_dynamic_seq(flow, tmp_path):
    torch.manual_seed(0)
    block = Block()
    quantize_block(block, flow)
    model = WithTaps(block).eval()
    seq = torch.export.Dim("seq", min=2, max=32)
    path = tmp_path / "block.pte"
    program = tke.export(model, (torch.randn(2, 8, 64),), path, dynamic_shapes=({1: seq},))
    ours = [op for op in tke.operators(program) if op in tke.OPS]
    assert ours, tke.operators(program)
    method = tke.load(path)
    linears = [getattr(block, n).inner for n in ("q", "k", "v", "o", "gate", "up", "down")]
    for t in (2, 7, 32):
        x = torch.randn(2, t, 64)
        with torch.no_grad():
            eager = block(x)
        got = run(method, x)
        assert len(got) == 1 + 2 * len(linears)
        # Every quantized linear: bit for bit on the inputs ExecuTorch gave it.
        for i, lin in enumerate(linears):
            x_et, y_et = got[1 + 2 * i], got[2 + 2 * i]
            assert y_et.shape == (2, t, lin.out_features)
            with torch.no_grad():
                assert torch.equal(y_et, lin(x_et)), f"t={t} linear {i}"
        # The block: ExecuTorch's float kernels (layer norm, softmax, bmm, SiLU) differ from
        # ATen's in the last bit (~1e-7 relative), which can move an activation across an
        # int8 rounding boundary in the next linear's dynamic quantization: one step there
        # moves outputs by ~1e-3. Measured max difference here: < 1e-3.
        torch.testing.assert_close(got[0], eager, rtol=1e-2, atol=1e-2)


# ---------------------------------------------------------------- errors


def test_unbounded_dynamic_dim_warns():
    model = mlp()
    tk.quantize_(model, bits=4, group_size=32)
    with pytest.warns(UserWarning, match="no upper bound"):
        tke.export(model, (torch.randn(4, 64),), dynamic_shapes=({0: torch.export.Dim("b")},))


def test_bit_width_mismatch_fails_cleanly(capfd):
    q = torch.randint(-8, 8, (32, 64), dtype=torch.int8)
    packed = tk.pack(q, torch.rand(32, 2) + 0.01, None, bits=4, group_size=32)

    class Wrong(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("packed", packed)

        def forward(self, x):  # 3-bit op on 4-bit weights
            return torch.ops.torchao._linear_8bit_act_3bit_weight(x, self.packed, 32, 32, 64)

    if tk.torchao_compat_status() != "registered":
        pytest.skip(tk.torchao_compat_status())
    program = tke.export(Wrong(), (torch.randn(2, 64),))
    method = tke.load(program.buffer)
    capfd.readouterr()
    with pytest.raises(RuntimeError):
        run(method, torch.randn(2, 64))
    assert "bit width mismatch" in capfd.readouterr().err  # ExecuTorch's log of the kernel's error


class _Lookup(nn.Module):
    def __init__(self, packed):
        super().__init__()
        self.register_buffer("packed", packed)

    def forward(self, idx):
        return torch.ops.torchao.shared_embedding_xbit(self.packed, 32, 32, 64, idx)


@pytest.mark.parametrize("case", ["indices_int16", "packed_float"])
def test_argument_errors_read_as_in_aten(case, capfd):
    """One set of argument checks: an argument ATen refuses (with a ValueError) makes the
    ExecuTorch kernel fail with the same message in its log."""
    q = torch.randint(-8, 8, (32, 64), dtype=torch.int8)
    packed = tk.pack(q, torch.rand(32, 2) + 0.01, None, bits=4, group_size=32)
    idx = torch.tensor([1, 2, 3])
    if case == "indices_int16":
        idx = idx.to(torch.int16)
    else:
        packed = packed.to(torch.float32)
    with pytest.raises(ValueError) as aten:
        _Lookup(packed)(idx)
    message = str(aten.value).splitlines()[0]
    assert message.startswith("indices must be" if case == "indices_int16" else "packed_weights must be"), message
    program = tke.export(_Lookup(packed), (idx,))
    method = tke.load(program.buffer)
    capfd.readouterr()
    with pytest.raises(RuntimeError):
        run(method, idx)
    assert message in capfd.readouterr().err


# ---------------------------------------------------------------- C++ runner


@pytest.mark.skipif(not os.path.exists(RUNNER), reason="tk_pte_runner not built (tools/build_executorch.sh)")
@pytest.mark.parametrize("max_isa", [None, "avx2", "reference"])
def test_cpp_runner_bit_exact(max_isa, tmp_path):
    model = mlp(seed=3)
    tk.quantize_(model, bits=5, group_size=32, has_zeros=True)
    tke.export(model, (torch.randn(4, 64),), tmp_path / "m.pte", dynamic_shapes=batch_dim())
    x = torch.randn(9, 64)
    x.numpy().tofile(tmp_path / "x.f32")
    env = dict(os.environ)
    env.pop("TORCHAO_KERNELS_MAX_ISA", None)
    if max_isa:
        env["TORCHAO_KERNELS_MAX_ISA"] = max_isa
    r = subprocess.run([RUNNER, str(tmp_path / "m.pte"), str(tmp_path / "y.f32"),
                        str(tmp_path / "x.f32"), "9,64"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "output 0: float32 [9, 48]" in r.stdout
    if max_isa == "reference":
        assert "__scalar" in r.stdout and "avx" not in r.stdout.split("stats:")[1]
    y = torch.from_file(str(tmp_path / "y.f32"), size=9 * 48, dtype=torch.float32).view(9, 48)
    assert torch.equal(y, model(x))
