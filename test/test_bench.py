"""The benchmark module: --quick runs end to end, and the ORT peer computes what
it claims (so its timings compare like with like)."""
import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import torchao_kernels as tk
from torchao_kernels import bench


def test_quick_runs_and_prints_table(tmp_path):
    out_json = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "torchao_kernels.bench", "--quick", "--quiet", "--json", str(out_json)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = proc.stdout
    assert out.startswith("machine: ")
    assert "| ours 4-bit " in out, out
    assert "| torch fp32 " in out, out
    assert "selected / fastest" in out, out
    data = json.loads(out_json.read_text())
    kinds = {r["kind"] for r in data["ops"]}
    assert {"ours", "fp32"} <= kinds
    for r in data["ops"]:
        assert r["median_s"] > 0 and r["gops"] > 0 and r["pct_roof"] > 0
        assert (r["n"], r["k"], r["threads"], r["mode"]) == (2048, 2048, 1, "hot")
    assert {r["m"] for r in data["ops"]} == {1, 32}
    ours = [r for r in data["ops"] if r["kind"] == "ours"]
    assert all(r["bits"] == 4 and "fp32" in r["speedup"] for r in ours)
    assert data["selection"], "per-kernel selection check produced no rows"


def test_bf16_scales_rows_read_fewer_bytes(tmp_path):
    out_json = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "torchao_kernels.bench", "--quick", "--quiet", "--no-kernels", "--m", "1",
         "--scales", "both", "--json", str(out_json)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "| ours 4-bit bf16 scales " in proc.stdout, proc.stdout
    ours = {r["op"]: r for r in json.loads(out_json.read_text())["ops"] if r["kind"] == "ours"}
    f32, bf16 = ours["ours 4-bit"], ours["ours 4-bit bf16 scales"]
    # 2048 rows x 64 groups x 2 bytes fewer
    assert f32["weight_bytes"] - bf16["weight_bytes"] == 2048 * 64 * 2


def test_selection_check_covers_every_thread_count(tmp_path):
    """With --threads 1,2 the per-kernel run checks selection at 2 threads too
    (each kernel forced through the op)."""
    out_json = tmp_path / "k.json"
    proc = subprocess.run(
        [sys.executable, "-m", "torchao_kernels.bench", "--kernels", "--shapes", "512x256", "--m", "1,8",
         "--threads", "1,2", "--bits", "4", "--mode", "hot", "--min-time", "0.02", "--quiet", "--json", str(out_json)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    sel = json.loads(out_json.read_text())["selection"]
    assert {(r["m"], r["threads"]) for r in sel} == {(1, 1), (8, 1), (1, 2), (8, 2)}, sel
    for r in sel:
        assert r["selected_s"] and r["fastest_s"] <= r["selected_s"], r
        assert r["flag"] == "ok" or r["flag"].startswith("SLOWER"), r
    assert "| thr |" in proc.stdout


@pytest.mark.parametrize("m", [1, 5])
def test_ort_matmulnbits_peer_matches_dequantized_linear(m):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    n, k = 96, 256
    g = torch.Generator().manual_seed(0)
    w = torch.randn(n, k, generator=g)
    x = torch.randn(m, k, generator=g)
    q, s, _ = tk.quantize_weight(w, 4, 32, False)
    b, sc = bench.ort_pack_4bit(q, s)
    assert b.shape == (n, k // 32, 16) and b.dtype.name == "uint8"
    assert sc.shape == (n * k // 32,)
    sess = bench.ort_session(b, sc, n, k, threads=1)
    y = torch.from_numpy(sess.run(None, {"A": x.numpy()})[0])
    ref = F.linear(x, tk.dequantize_weight(q, s, None, 32))
    assert y.shape == ref.shape
    # int8 activations: ~0.5% error expected; a nibble or scale mix-up is far off.
    rel = ((y - ref).norm() / ref.norm()).item()
    assert rel < 0.02, rel
    assert (y - ref).abs().max().item() < 0.05 * ref.abs().max().item()


def test_cli_parsing():
    assert bench._parse_shapes("4096x4096, 2048X1024") == [(4096, 4096), (2048, 1024)]
    with pytest.raises(Exception):
        bench._parse_shapes("4096x100")  # k not a multiple of the group size
    args = bench._resolve(bench._parser().parse_args(["--quick", "--m", "4"]))
    assert args.shapes == [(2048, 2048)] and args.m == [4] and args.threads == [1] and args.bits == [4]
    assert args.mode == "hot"
    args = bench._resolve(bench._parser().parse_args([]))
    assert args.mode == "both" and args.bits == [2, 3, 4, 8] and args.min_time == 0.2


def test_roofline_is_min_of_compute_and_bandwidth():
    roof = bench.Roofline(peak_gops_per_core=100.0, dram_bytes=1 << 30, min_time=0.01)
    roof.bw[(1 << 20, 1)] = 10.0
    roof.bw[(1 << 30, 2)] = 5.0
    # 4 ops per byte at 10 GB/s: 40 GOPS, under the 100 GOPS peak
    assert roof.roof(4000, 1000, 1000, 1, cold=False) == (40.0, "mem")
    # 100 ops per byte: compute-bound at 2 threads x 100 GOPS
    assert roof.roof(100000, 1000, 1000, 2, cold=True) == (200.0, "cmp")


def test_x86_gemm_ceiling_tool_builds_and_runs(tmp_path):
    """tools/x86_gemm_ceiling.cpp (the L1-resident ceiling of the AVX512-VNNI
    tiles quoted in docs/benchmarks.md) compiles anywhere g++ targets x86-64,
    and on a CPU with AVX512-VNNI prints the peak line and one row per tile."""
    import os
    import platform
    import shutil

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86-64 tool")
    gxx = shutil.which("g++")
    assert gxx, "g++ is needed to build the extension, so it must be here"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    exe = tmp_path / "ceiling"
    flags = ["-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mfma"]
    proc = subprocess.run([gxx, *flags, os.path.join(root, "tools", "x86_gemm_ceiling.cpp"), "-o", str(exe)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    isa = set(json.loads(torch.ops.torchao_kernels._info_json())["cpu"]["isa"])
    if not {"avx512f", "avx512bw", "avx512vl", "avx512vnni"} <= isa:
        return  # built; running it needs the ISA
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("clock "), out.stdout
    rows = [l for l in out.stdout.splitlines() if l.startswith("| ") and "x" in l.split("|")[1]]
    assert [r.split("|")[1].strip() for r in rows] == ["4x32", "8x32", "4x64", "8x48", "6x64", "4x96"], out.stdout
