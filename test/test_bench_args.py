"""The bench and bench_embedding command lines reject bad values as argparse
usage errors (exit 2, naming the option and the value) before anything is
measured, a model loads or a capped process starts, and ignore no option
silently: they used to end in tracebacks after the roofline measurements
(a group size not dividing k, a bad regex, an unwritable --json path that
also lost the report, an overflow in torch.set_num_threads, allocation
errors), accept NaN peaks, run with a kernel filter matching nothing, and
drop options --selection and --models do not use."""
import json

import pytest

import torchao_kernels as tk
from torchao_kernels import bench, bench_embedding, tuning

from usage_errors import usage_error

T = ["--shapes", "64x64", "--m", "1", "--threads", "1", "--bits", "4", "--mode", "hot", "--min-time", "0.01",
     "--quiet"]
SEL = ["--selection", "--shapes", "64x64", "--m", "1", "--threads", "1", "--bits", "4", "--min-time", "0.01",
       "--quiet"]


@pytest.fixture
def no_work(monkeypatch):
    """Fails the test if a command gets past its arguments to measuring, a
    model or a capped process."""
    def fail(*a, **k):
        pytest.fail("the command went past argument checking")
    for mod, name in ((bench, "measure_int8_ceilings"), (bench, "bench_ops"), (bench, "bench_kernels"),
                      (bench, "_run_capped_subprocess"), (tuning, "selection_report"),
                      (bench_embedding, "model_check"), (bench_embedding, "_measure"),
                      (bench_embedding, "kernel_times")):
        monkeypatch.setattr(mod, name, fail)
    monkeypatch.setattr(bench.os, "execve", fail)
    monkeypatch.setattr(bench.Roofline, "_measure_bw", fail)


def _x86_avx2():
    return bench.platform.machine().lower() in ("x86_64", "amd64") and "avx2" in tk.isa_levels()


# ---------------------------------------------------------------------------
# bench

@pytest.mark.parametrize("extra, needles", [
    (["--group-size", "48"], ["--group-size 48: it must divide every k", "64x64"]),
    (["--kernel-filter", "("], ["argument --kernel-filter: not a valid regular expression", "'('"]),
    (["--kernel-filter", "bogus"], ["--kernel-filter 'bogus' matches none of the kernels"]),
    (["--json", "/nonexistent/dir/x.json"], ["argument --json", "'/nonexistent/dir' of '/nonexistent/dir/x.json' "
                                                                "does not exist"]),
    (["--threads", "100000000000"], ["argument --threads: expected integers in 1..4096", "'100000000000'"]),
    (["--m", "1000000000000"], ["argument --m: expected integers in 1..1073741824", "'1000000000000'"]),
    (["--peak-gops", "nan"], ["argument --peak-gops: expected a finite number > 0, got 'nan'"]),
    (["--peak-gops", "inf"], ["argument --peak-gops: expected a finite number > 0, got 'inf'"]),
    (["--peak-gops", "-5"], ["argument --peak-gops: expected a finite number > 0, got '-5'"]),
    (["--iters", "0"], ["argument --iters: expected an integer > 0, got '0'"]),
    (["--bits", "9"], ["argument --bits: bit widths must be in 1..8, got '9'"]),
    (["--group-size", "65536"], ["argument --group-size: group size must be at most 32768 (int32 group sums stay "
                                      "exact), got 65536"]),
    (["--no-kernels", "--kernel-filter", "avx2"], ["--kernel-filter 'avx2'", "--no-kernels leaves out"]),
    (["--kernels", "--scales", "bfloat16"], ["--kernels: --scales bfloat16 would do nothing",
                                             "float32 scales and hot weights"]),
    (["--kernels", "--mode", "cold"], ["--kernels: --mode cold would do nothing"]),
])
def test_bench_rejects_bad_values_before_measuring(extra, needles, capsys, no_work):
    usage_error(bench.run, T + extra, capsys, *needles)


def test_bench_rejects_huge_shapes(capsys, no_work, monkeypatch):
    usage_error(bench.run, T[2:] + ["--shapes", "100000000000x64"], capsys,
                 "argument --shapes: shape '100000000000x64': n and k must be at most 2^30")
    # Within 2^30 but beyond memory: the float32 weights of one call alone.
    monkeypatch.setattr(bench, "physical_memory_bytes", lambda: 1 << 30, raising=False)
    usage_error(bench.run, T[2:] + ["--shapes", "65536x8192"], capsys,
                 "--shapes 65536x8192 with --m 1", "more than this machine's 1.0 GiB of memory")
    usage_error(bench.run, ["--shapes", "64x64", "--m", "4194304"] + T[4:], capsys, "--shapes 64x64 with --m 4194304")


def test_bench_cap_checks_before_the_capped_process(capsys, no_work, monkeypatch):
    for var in ("TORCHAO_KERNELS_MAX_ISA", "FBGEMM_ENABLE_INSTRUCTIONS", "MKL_ENABLE_INSTRUCTIONS", bench.CAP_MARK):
        monkeypatch.delenv(var, raising=False)
    argv = ["--cap", "avx2", *T, "--peak-gops", "nan"]
    usage_error(bench.run, argv, capsys, "argument --peak-gops", "'nan'")     # run(): no subprocess
    usage_error(bench._main, argv, capsys, "argument --peak-gops", "'nan'")   # __main__: no re-exec


@pytest.mark.parametrize("extra, needles", [
    (["--bits", "9"], ["argument --bits: bit widths must be in 1..8, got '9'"]),
    (["--iters", "0"], ["argument --iters: expected an integer > 0, got '0'"]),
    (["--peak-gops", "-5"], ["argument --peak-gops: expected a finite number > 0, got '-5'"]),
    (["--kernel-filter", "("], ["argument --kernel-filter: not a valid regular expression"]),
    (["--json", "/nonexistent/dir/x.json"], ["argument --json", "does not exist"]),
    (["--threads", "100000000000"], ["argument --threads", "'100000000000'"]),
    (["--iters", "5"], ["--selection does not use --iters"]),
    (["--kernels"], ["--selection does not use --kernels"]),
    (["--no-kernels"], ["--selection does not use --no-kernels"]),
    (["--peak-gops", "5"], ["--selection does not use --peak-gops"]),
    (["--kernel-filter", "avx2"], ["--selection does not use --kernel-filter"]),
    (["--mode", "cold"], ["--selection does not use --mode"]),
    (["--scales", "both"], ["--selection does not use --scales"]),
    (["--quick"], ["--selection does not use --quick"]),
    (["--kernels", "--no-kernels", "--mode", "cold", "--scales", "both"],
     ["--selection does not use --kernels, --no-kernels, --mode, --scales"]),
])
def test_bench_selection_checks_and_refuses_what_it_does_not_use(extra, needles, capsys, no_work):
    usage_error(bench.run, SEL + extra, capsys, *needles)


def test_bench_selection_reports_the_cap(tmp_path, capsys, monkeypatch):
    if not _x86_avx2():
        pytest.skip("--cap avx2 needs an x86 build with the avx2 level")
    # This process as if started for the cap; selection's timing replaced.
    for var, value in bench.cap_env("avx2").items():
        monkeypatch.setenv(var, value)
    monkeypatch.setenv(bench.CAP_MARK, "avx2")
    monkeypatch.setattr(tuning, "selection_report", lambda *a, **k: ("TABLE\n", []))
    out = tmp_path / "sel.json"
    assert bench.run(SEL + ["--cap", "avx2", "--json", str(out)]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert head.startswith("machine: ") and "capped to avx2" in head, head
    data = json.loads(out.read_text())
    assert data["cap"]["isa"] == "avx2" and data["machine"]["cap"]["isa"] == "avx2"


def test_bench_prints_the_report_before_the_json_and_notes_the_kernel_tables_settings(tmp_path, capsys,
                                                                                       monkeypatch):
    """--scales bfloat16 with both tables: the kernel table's float32 scales
    are noted and recorded; the report is out before the JSON is written."""
    monkeypatch.setattr(bench, "measure_int8_ceilings", lambda quiet=True: [])
    monkeypatch.setattr(bench.Roofline, "_measure_bw", lambda self, nbytes, threads: 10.0)
    printed = []
    dump = bench.json.dump

    def spy(data, f, **kw):
        printed.append(capsys.readouterr().out)
        return dump(data, f, **kw)

    monkeypatch.setattr(bench.json, "dump", spy)
    out = tmp_path / "b.json"
    assert bench.run(T + ["--scales", "bfloat16", "--iters", "2", "--json", str(out)]) == 0
    assert printed and printed[0].startswith("machine: "), printed
    assert "--scales bfloat16: the op table only; the kernel and selection tables time float32 scales" \
        in printed[0], printed[0]
    data = json.loads(out.read_text())
    assert data["config"]["scales"] == "bfloat16"
    assert data["kernel_table"] == {"scales": "float32", "mode": "hot"}


def test_bench_accepts_valid_values():
    args = bench._parse(T + ["--peak-gops", "100", "--iters", "3", "--kernel-filter", "avx|scalar"])
    assert (args.threads, args.m, args.peak_gops, args.iters, args.scales) == ([1], [1], 100.0, 3, "float32")
    assert bench._parse(["--kernels"]).mode == "hot" and bench._parse([]).mode == "both"
    assert bench._parse(["--threads", "4096"]).threads == [4096]
    args = bench._parse(["--selection"])
    assert (args.shapes, args.m, args.bits, args.threads, args.min_time) == (
        list(tuning.SELECTION_SHAPES), list(tuning.SELECTION_M), [2, 4, 8], [1, 2], 0.05)
    # From Python, _bench reports the same checks as ValueError.
    with pytest.raises(ValueError, match="--group-size 48: it must divide every k"):
        bench._bench(T + ["--group-size", "48"])


# ---------------------------------------------------------------------------
# bench_embedding

@pytest.mark.parametrize("argv, needles", [
    (["--models", "--group-size", "17"], ["--group-size with --models must be a multiple of 16", "got 17"]),
    (["--models", "--group-size", "128"], ["SmolLM2-135M 576, all-MiniLM-L6-v2 384", "got 128"]),
    (["--models", "--shape", "64x64"], ["--models does not use --shape"]),
    (["--models", "--count", "8"], ["--models does not use --count"]),
    (["--models", "--min-time", "1"], ["--models does not use --min-time"]),
    (["--models", "--json", "out.json"], ["--models does not use --json"]),
    (["--models", "--threads", "100000000000"], ["argument --threads: expected at most 4096 threads",
                                                 "'100000000000'"]),
    (["--threads", "100000000000"], ["argument --threads: expected at most 4096 threads", "'100000000000'"]),
    (["--count", "100000000000000"], ["--shape 49152x576 with --count 100000000000000", "memory"]),
    (["--json", "/nonexistent/x.json"], ["argument --json", "'/nonexistent' of '/nonexistent/x.json' does not exist"]),
    (["--shape", "2000000000x64"], ["argument --shape: expected sizes of at most 2^30", "'2000000000x64'"]),
    (["--shape", "64x65536", "--group-size", "65536"], ["argument --group-size: group size must be at most 32768 "
                                                        "(int32 group sums stay exact), got 65536"]),
])
def test_bench_embedding_rejects_bad_values_before_the_work(argv, needles, capsys, no_work, monkeypatch):
    def fail(*a, **k):
        pytest.fail("the command went past argument checking")
    # The table is built (and the threads set) before any timing.
    monkeypatch.setattr(bench_embedding.tk, "quantize_weight", fail)
    monkeypatch.setattr(bench_embedding.torch, "set_num_threads", fail)
    usage_error(bench_embedding.run, argv, capsys, *needles)
