"""bench_tp, distributed.example and the tools gemv_prefetch_by_row_length,
count_arm_insns and gen_kernels reject bad values as argparse usage errors
(exit 2, naming the option and the value) before any work: they used to fail
late (inside a rank, after the ninja build or after earlier shapes were timed),
print 0 or nan tokens/s, or silently drop what they were given. Every command
is run in-process with whatever would start ranks, load models, build or time
replaced by a failure."""
import importlib.util
import os
import sys
from pathlib import Path

import pytest

from torchao_kernels import bench_tp, models
from torchao_kernels.distributed import example
from torchao_kernels.distributed import runtime
from torchao_kernels.distributed import shm

from usage_errors import usage_error

ROOT = Path(__file__).resolve().parent.parent


def _tool(name: str):
    """A script of tools/, imported from its path (under a name of its own)."""
    spec = importlib.util.spec_from_file_location(f"_tool_args_{name}", ROOT / "tools" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


gemv_prefetch = _tool("gemv_prefetch_by_row_length")
count_arm = _tool("count_arm_insns")
gen_kernels = _tool("gen_kernels")


def _fail(*a, **k):
    pytest.fail("the command went past argument checking")


@pytest.fixture
def no_ranks(monkeypatch):
    """No rank starts, no model loads; 2 cores; not under torchrun; shared memory possible."""
    import torchao_kernels.distributed as dist_pkg

    monkeypatch.setattr(runtime, "launch", _fail)
    monkeypatch.setattr(runtime, "init_tp", _fail)
    monkeypatch.setattr(dist_pkg, "launch", _fail, raising=False)
    monkeypatch.setattr(models, "load_smollm2", _fail)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(shm, "shm_supported", lambda: None)
    for var in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)


# ---------------------------------------------------------------------------
# python -m torchao_kernels.bench_tp

@pytest.mark.parametrize("argv, needles", [
    (["--tp", "0"], ["argument --tp", "'0'"]),
    (["--tp", "-1"], ["argument --tp", "'-1'"]),
    (["--tp", "1"], ["argument --tp", "at least 2", "got 1"]),
    (["--tp", "3"], ["argument --tp", "3 ranks", "only 2 cores"]),
    (["--rounds", "0"], ["argument --rounds", "'0'"]),
    (["--repeats", "0"], ["argument --repeats", "'0'"]),
    (["--decode-tokens", "-1"], ["argument --decode-tokens", "'-1'"]),
    (["--decode-tokens", "0"], ["argument --decode-tokens", "'0'"]),
    (["--bits", "9"], ["argument --bits", "'9'"]),
    (["--bits", "0"], ["argument --bits", "'0'"]),
    (["--group-size", "0"], ["argument --group-size", "got 0"]),
    (["--group-size", "24"], ["argument --group-size", "got 24"]),
    (["--modes", "bogus"], ["argument --modes", "'bogus'"]),
    (["--modes", ","], ["argument --modes", "','"]),
    (["--modes", ""], ["argument --modes", "''"]),
    (["--modes", "reduce,,exact"], ["argument --modes", "'reduce,,exact'"]),
    (["--modes", "reduce,reduce"], ["argument --modes", "'reduce,reduce'"]),
    (["--method", "bogus"], ["argument --method", "'bogus'"]),
    (["--method", "gptq"], ["argument --method", "'gptq'"]),
    (["--json", "/nonexistent/dir/rows.json"], ["argument --json", "/nonexistent/dir/rows.json"]),
])
def test_bench_tp_rejects_bad_values_before_any_rank(argv, needles, capsys, no_ranks):
    usage_error(bench_tp.main, argv, capsys, *needles)


def test_bench_tp_rejects_shm_where_it_cannot_run(capsys, no_ranks, monkeypatch):
    monkeypatch.setattr(shm, "shm_supported", lambda: "no /dev/shm")
    usage_error(bench_tp.main, ["--comm", "shm"], capsys, "argument --comm", "'shm'", "no /dev/shm")


def test_bench_tp_accepts_valid_values(no_ranks):
    a = bench_tp.parse_args([])
    assert (a.tp, a.modes, a.bits, a.group_size, a.repeats, a.rounds) == (
        2, ["reduce", "full_row_quant", "exact"], 4, 32, 3, 1)
    a = bench_tp.parse_args(["--modes", "exact, reduce", "--method", "rtn", "--decode-tokens", "1"])
    assert (a.modes, a.method, a.decode_tokens) == (["exact", "reduce"], "rtn", 1)


# ---------------------------------------------------------------------------
# python -m torchao_kernels.distributed.example

@pytest.mark.parametrize("argv, needles", [
    (["--tp", "0"], ["argument --tp", "'0'"]),
    (["--threads", "0"], ["argument --threads", "'0'"]),
    (["--text-tokens", "0"], ["argument --text-tokens", "'0'"]),
    (["--text-tokens", "1"], ["argument --text-tokens", ">= 2", "'1'"]),
    (["--group-size", "0"], ["argument --group-size", "got 0"]),
    (["--bits", "9"], ["argument --bits", "'9'"]),
    (["--gen-tokens", "-1"], ["argument --gen-tokens", "'-1'"]),
    (["--gen-tokens", "0"], ["argument --gen-tokens", "'0'"]),
    (["--generate", "--gen-tokens", "1"], ["argument --gen-tokens", "at least 2", "got 1"]),
    (["--generate", "--text-tokens", "64"], ["argument --text-tokens", "--generate", "64"]),
    (["--tp", "3"], ["argument --tp", "3 ranks", "only 2 cores", "--threads"]),
    (["--tp", "3", "--threads", "1", "--pin"], ["argument --tp", "3 ranks", "only 2 cores", "--pin"]),
])
def test_example_rejects_bad_values_before_any_rank(argv, needles, capsys, no_ranks):
    usage_error(example.main, argv, capsys, *needles)


def test_example_accepts_valid_values(no_ranks):
    a = example.parse_args([])
    assert (a.tp, a.threads, a.text_tokens, a.gen_tokens, a.bits, a.group_size) == (2, None, 512, 24, 4, 32)
    a = example.parse_args(["--text-tokens", "2", "--gen-tokens", "1"])
    assert (a.text_tokens, a.gen_tokens) == (2, 1)
    # more ranks than cores may share them when the threads are given and nothing is pinned
    assert example.parse_args(["--tp", "3", "--threads", "1"]).tp == 3


def test_example_docstring_names_the_three_modes():
    for mode in ("reduce", "full_row_quant", "exact"):
        assert mode in example.__doc__
    assert "once with full_row_quant=True" not in example.__doc__


def _report(used, asked):
    return {"rank": 0, "tp": 2, "threads": 1, "kv_heads": 1, "packed_bytes": 1e6, "packed_bytes_tp1": 2e6,
            "model_bytes": 1e6, "model_bytes_tp1": 2e6, "explain_m1": {}, "variants": {},
            "text_tokens": used, "text_tokens_asked": asked}


def test_example_says_how_many_text_tokens_the_perplexity_used():
    out = example.summarize([_report(300, 512)])
    assert "perplexity over 300 text tokens (--text-tokens 512 asked: the text has only 300)" in out
    out = example.summarize([_report(64, 64)])
    assert "perplexity over 64 text tokens" in out and "asked" not in out


# ---------------------------------------------------------------------------
# tools/gemv_prefetch_by_row_length.py

@pytest.fixture
def no_timing(monkeypatch):
    monkeypatch.setattr(gemv_prefetch.tk, "info", _fail)
    monkeypatch.setattr(gemv_prefetch.tuning, "_packed_problem", _fail)
    monkeypatch.setattr(gemv_prefetch.tuning, "_time_rows", _fail)


@pytest.mark.parametrize("argv, needles", [
    (["--shapes", ","], ["argument --shapes", "''"]),
    (["--shapes", "4096x"], ["argument --shapes", "'4096x'"]),
    (["--shapes", "1e3x64"], ["argument --shapes", "'1e3x64'"]),
    (["--shapes", "4096"], ["argument --shapes", "'4096'"]),
    (["--shapes", "0x64"], ["argument --shapes", "'0x64'"]),
    (["--shapes", "64x-1"], ["argument --shapes", "'64x-1'"]),
    (["--shapes", "64x48"], ["argument --shapes", "'64x48'"]),
    (["--shapes", "576x576,64x48"], ["argument --shapes", "'64x48'"]),  # late in the list: before any timing
    (["--bits", ","], ["argument --bits", "','"]),
    (["--bits", "9"], ["argument --bits", "'9'"]),
    (["--bits", "0"], ["argument --bits", "'0'"]),
    (["--threads", "0"], ["argument --threads", "'0'"]),
    (["--m", "-1"], ["argument --m", "'-1'"]),
    (["--m", "0"], ["argument --m", "'0'"]),
    (["--min-time", "nan"], ["argument --min-time", "'nan'"]),
    (["--min-time", "inf"], ["argument --min-time", "'inf'"]),
    (["--min-time", "-1"], ["argument --min-time", "'-1'"]),
    (["--min-time", "0"], ["argument --min-time", "'0'"]),
])
def test_gemv_prefetch_rejects_bad_values_before_timing(argv, needles, capsys, no_timing):
    usage_error(gemv_prefetch.main, argv, capsys, *needles)


def test_gemv_prefetch_accepts_valid_values():
    a = gemv_prefetch._parser().parse_args(["--shapes", "64x64,128x96", "--bits", "3,8", "--threads", "2",
                                            "--m", "4", "--min-time", "0.01"])
    assert (a.shapes, a.bits, a.threads, a.m, a.min_time) == ([(64, 64), (128, 96)], [3, 8], [2], 4, 0.01)
    a = gemv_prefetch._parser().parse_args([])
    assert a.bits == [2, 4, 8] and a.threads == [1, 2] and (576, 576) in a.shapes


# ---------------------------------------------------------------------------
# tools/count_arm_insns.py

@pytest.fixture
def no_build(monkeypatch):
    monkeypatch.setattr(count_arm.subprocess, "run", _fail)


@pytest.fixture
def tool(tmp_path):
    p = tmp_path / "count_insns.py"
    p.write_text("")
    return str(p)


@pytest.mark.parametrize("argv, needles", [
    (["--m", ","], ["argument --m", "','"]),
    (["--m", "0"], ["argument --m", "'0'"]),
    (["--m", "-1"], ["argument --m", "'-1'"]),
    (["--m", "1,x"], ["argument --m", "'1,x'"]),
    (["--embedding", "--m", "0,bogus"], ["argument --m", "'0,bogus'"]),
    (["--embedding", "--m", "4"], ["argument --m", "--embedding"]),
    (["--out", "/nonexistent/a.md"], ["argument --out", "/nonexistent/a.md"]),
])
def test_count_arm_insns_rejects_bad_values_before_the_build(argv, needles, capsys, no_build, tool):
    usage_error(count_arm.main, argv + ["--tool", tool], capsys, *needles)


def test_count_arm_insns_checks_the_tool_before_the_build(capsys, no_build):
    usage_error(count_arm.main, ["--tool", "/nonexistent/count.py"], capsys, "argument --tool",
                 "/nonexistent/count.py")


def test_count_arm_insns_accepts_valid_values(tool, tmp_path):
    a = count_arm.parse_args(["--tool", tool, "--m", "1,3", "--out", str(tmp_path / "a.md")])
    assert a.m == [1, 3] and not a.embedding
    assert count_arm.parse_args(["--tool", tool]).m == [1, 2, 4, 32]
    assert count_arm.parse_args(["--tool", tool, "--embedding"]).embedding


def test_count_arm_insns_shows_the_failing_tools_stderr(tmp_path, capsys):
    bad = tmp_path / "count_insns.py"
    bad.write_text("import sys\nsys.stderr.write('qemu-aarch64: not found\\n')\nsys.exit(3)\n")
    with pytest.raises(SystemExit) as e:
        count_arm.count_region(str(bad), "max", ["kernel", 1])
    assert "exit 3" in str(e.value.code)
    assert "qemu-aarch64: not found" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# tools/gen_kernels.py

def test_gen_kernels_rejects_check_with_names(capsys, monkeypatch):
    monkeypatch.setattr(gen_kernels, "load", _fail)
    usage_error(gen_kernels.main, ["--check", "--names"], capsys, "--names", "--check")
