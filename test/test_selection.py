"""Kernel selection: the golden table over the fake CPUs, selection properties,
overrides (Python API and environment), thread safety of first calls,
heterogeneous CPUs and the one-time "repack" warning.

Regenerate the golden table after a registry or policy change with
    EXPECTTEST_ACCEPT=1 python -m pytest test/test_selection.py -k golden
and review the diff of test/golden/selection_table.txt like code.
"""
import difflib
import json
import os
import platform
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

import torchao_kernels as tk

GOLDEN = Path(__file__).parent / "golden" / "selection_table.txt"

INFO = tk.info()
KERNELS = {k["name"]: k for k in INFO["kernels"]}
FORMATS = [f["name"] for f in INFO["formats"]]
FAKE_CPUS = tk.fake_cpus()
CPU_ISA = set(INFO["cpu"]["isa"])
# One m per bucket: 1, 2, 3, 4-7, 8-15, 16-31, 32-63, 64-127, 128+.
BUCKET_MS = [1, 2, 3, 4, 8, 16, 32, 64, 128]
# ISA features each max_isa level allows on x86 (mirrors the selector's table,
# so that a change there shows up here).
X86_AVX2_SET = {"sse4.2", "avx2", "fma"}

needs_avx2 = pytest.mark.skipif(
    not {"avx2", "fma"} <= CPU_ISA, reason="this CPU lacks avx2+fma, so no avx2 kernel can run"
)


@pytest.fixture(autouse=True)
def default_overrides():
    """Every test starts and ends with no overrides (this also drops any
    TORCHAO_KERNELS_* environment overrides of the runner) and a fresh cache."""
    tk.set_overrides()
    try:
        yield
    finally:
        tk.set_overrides()


def _weights(bits=4, n=96, k=256, group_size=32, zeros=False, bias=False, seed=0, target=None):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen)
    q, s, z = tk.quantize_weight(w, bits, group_size, zeros)
    b = torch.randn(n, generator=gen) if bias else None
    packed = tk.pack(q, s, z, bits=bits, group_size=group_size, bias=b, target=target)
    return packed, (q, s, z, b)


def _x(m, k=256, seed=1):
    return torch.randn(m, k, generator=torch.Generator().manual_seed(seed))


def _run(packed, x):
    info = tk.packed_info(packed)
    return tk.linear(x, packed, info["group_size"], info["n"], info["k"])


def _ran(x, packed):
    """(output, {kernel: calls}) of one op call, from the stats() counters."""
    tk.reset_stats()
    y = _run(packed, x)
    return y, tk.stats()


def _winners(expl):
    return [c["winner"] for c in expl.to_dict()["clusters"]]


# ---------------------------------------------------------------------------
# Golden table


def render_selection_table() -> str:
    name_w = max(len(n) for n in KERNELS) + 2
    lines = [
        "# Kernel selection on every fake CPU (torchao_kernels.fake_cpus()), for the",
        "# kernels compiled into this build: bits=4, no zero points, no bias, no overrides,",
        "# 1 thread (the class's thread bucket; the machine's own count would make the table",
        "# depend on where it runs).",
        "# 'pack' is the format pack() chooses there (best_format(4)); each row gives the",
        "# winner of explain(format, m, cpu=...) per core cluster (no weights given: assumed",
        "# streamed from DRAM, with long rows and short groups); 'lookup' rows: the",
        "# embedding-lookup kernel (explain(packed, op='embedding', cpu=...)).",
        "# Regenerate: EXPECTTEST_ACCEPT=1 python -m pytest test/test_selection.py -k golden",
        f"# build: {platform.machine()}; kernels: {len(KERNELS)}; formats: {' '.join(FORMATS)}",
    ]
    for cpu in FAKE_CPUS:
        d = tk.cpu_descriptor(cpu)
        lines += [
            "",
            f"== {cpu} ({d['arch']}; isa: {' '.join(d['isa']) or 'none'}) "
            f"pack: {tk.best_format(4, cpu=cpu)}",
        ]
        heads = [f"cluster {i}: {c['uarch']} ({c['uarch_class']}, {c['cores']} cores)"
                 for i, c in enumerate(d["clusters"])]
        col_w = max([name_w] + [len(h) + 2 for h in heads])
        lines.append(f"  {'format':<8}{'m':>4}  {'bucket':<8}" + "".join(f"{h:<{col_w}}" for h in heads))
        for fmt in FORMATS:
            for m in BUCKET_MS:
                e = tk.explain(fmt, m, 1, cpu=cpu).to_dict()
                cells = [c["winner"] or f"NONE: {c['error']}" for c in e["clusters"]]
                lines.append(f"  {fmt:<8}{m:>4}  {e['m_bucket']:<8}" + "".join(f"{c:<{col_w}}" for c in cells))
            # embedding lookups in this format (one class for every m)
            e = tk.explain(_lookup_buffer(fmt), op="embedding", threads=1, cpu=cpu).to_dict()
            cells = [c["winner"] or f"NONE: {c['error']}" for c in e["clusters"]]
            lines.append(f"  {fmt:<8}{'':>4}  {'lookup':<8}" + "".join(f"{c:<{col_w}}" for c in cells))
    return "\n".join(line.rstrip() for line in lines) + "\n"


def _lookup_buffer(fmt: str) -> torch.Tensor:
    q = torch.zeros(16, 32, dtype=torch.int8)
    return tk.pack(q, torch.ones(16, 1), None, bits=4, group_size=32, target=fmt)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                    reason="the golden table lists the kernels of an x86_64 build")
def test_golden_selection_table():
    actual = render_selection_table()
    if os.getenv("EXPECTTEST_ACCEPT"):  # expecttest's convention
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(actual)
        return
    if not GOLDEN.exists():
        pytest.fail(f"{GOLDEN} is missing; generate it with EXPECTTEST_ACCEPT=1")
    expected = GOLDEN.read_text()
    if actual != expected:
        diff = "".join(difflib.unified_diff(
            expected.splitlines(keepends=True), actual.splitlines(keepends=True),
            fromfile=str(GOLDEN), tofile="actual selection"))
        pytest.fail("kernel selection changed (if intended, rerun with EXPECTTEST_ACCEPT=1 and "
                    "review the diff):\n" + diff, pytrace=False)


# ---------------------------------------------------------------------------
# Properties of the pure selection, on every fake CPU


@pytest.mark.parametrize("cpu", FAKE_CPUS)
def test_winner_is_runnable_reads_the_format_and_always_exists(cpu):
    d = tk.cpu_descriptor(cpu)
    cpu_isa = set(d["isa"])
    for fmt in FORMATS:
        for m in BUCKET_MS:
            for bits in range(1, 9):
                for zeros in (False, True):
                    for bias in (False, True):
                        e = tk.explain(fmt, m, cpu=cpu, bits=bits, zeros=zeros, bias=bias).to_dict()
                        where = f"{cpu} format={fmt} m={m} bits={bits} zeros={zeros} bias={bias}"
                        assert e["format"] == fmt, where
                        assert len(e["clusters"]) == len(d["clusters"]), where
                        for c in e["clusters"]:
                            w = c["winner"]
                            assert w is not None, f"{where} cluster {c['cluster']}: {c['error']}"
                            kinfo = KERNELS[w]
                            missing = set(kinfo["required_isa"]) - cpu_isa
                            assert not missing, f"{where}: {w} needs {missing}"
                            assert kinfo["format"] == fmt, f"{where}: {w} reads {kinfo['format']}"
                            assert str(bits) in [str(b) for b in kinfo["bits"]], where
                            assert kinfo["zeros"] or not zeros, where
                            assert kinfo["bias"] or not bias, where
                            # without force, the winner is meant for this m
                            assert kinfo["m_min"] <= m, where
                            assert kinfo["m_max"] is None or kinfo["m_max"] >= m, where
                            cand = [x for x in c["candidates"] if x["name"] == w]
                            assert len(cand) == 1 and cand[0]["eligible"], where
                            best = max(x["score"] for x in c["candidates"] if x["eligible"])
                            assert cand[0]["score"] == best, where
        # the pack-time choice is a format some kernel runs there
        assert tk.best_format(4, cpu=cpu) in FORMATS


def test_reference_kernel_is_the_fallback_everywhere():
    with tk.overrides(max_isa="reference"):
        for cpu in FAKE_CPUS:
            for fmt in FORMATS:
                for m in (1, 5, 200):
                    for w in _winners(tk.explain(fmt, m, cpu=cpu, bits=3, zeros=True, bias=True)):
                        assert w is not None and KERNELS[w]["required_isa"] == [], (cpu, fmt, m, w)
                        assert KERNELS[w]["format"] == fmt


def test_every_format_has_a_reference_kernel():
    for fmt in FORMATS:
        for op in ("linear", "embedding"):
            refs = [k for k in KERNELS.values() if k["format"] == fmt and not k["required_isa"] and k["op"] == op]
            assert refs, f"format {fmt} has no reference {op} kernel"
            # lookups return weight rows: no bias to support
            assert all(k["bits"] == [1, 2, 3, 4, 5, 6, 7, 8] and k["zeros"] and k["bias"] == (op == "linear")
                       for k in refs)


# ---------------------------------------------------------------------------
# Overrides reach every path


@needs_avx2
@pytest.mark.filterwarnings("ignore:.*repack")
def test_max_isa_avx2_caps_explain_the_op_pack_repack_and_info():
    packed, _ = _weights(bits=4, zeros=True, bias=True)
    portable, _ = _weights(bits=4, zeros=True, bias=True, target="n1k4")
    expected = {m: _run(packed, _x(m)) for m in (1, 64)}

    with tk.overrides(max_isa="avx2"):
        assert tk.get_overrides()["max_isa"] == "avx2"
        # explain: no winner above the cap, on this CPU and on fake CPUs
        for cpu in (None, "zen4", "alder-lake", "skylake-x"):
            for fmt in FORMATS:
                for m in BUCKET_MS:
                    for w in _winners(tk.explain(fmt, m, cpu=cpu)):
                        assert "avx512" not in w and "avxvnni" not in w, (cpu, fmt, m, w)
                        assert set(KERNELS[w]["required_isa"]) <= X86_AVX2_SET, (cpu, fmt, m, w)
        # the op: an avx2 kernel serves both shape classes, with the same bits
        for m in (1, 64):
            y, ran = _ran(_x(m), packed)
            assert ran and all(KERNELS[k]["isa"] == "avx2" for k in ran), (m, ran)
            assert torch.equal(y, expected[m])
        # pack with target=None: a valid buffer in a format the capped CPU runs
        repacked_default, _ = _weights(bits=4, zeros=True, bias=True)
        info = tk.packed_info(repacked_default)
        assert info["format"] == tk.best_format(4, zeros=True, bias=True)
        assert (info["n"], info["k"], info["bits"], info["has_zeros"], info["has_bias"]) == (
            96, 256, 4, True, True)
        assert torch.equal(_run(repacked_default, _x(64)), expected[64])
        # repack converts to the capped CPU's best format, results unchanged
        converted = tk.repack(portable)
        assert tk.packed_info(converted)["format"] == tk.best_format(4, zeros=True, bias=True)
        y, ran = _ran(_x(1), converted)
        assert all(KERNELS[k]["isa"] in ("avx2", "scalar") for k in ran), ran
        assert torch.equal(y, expected[1])
        # info(): the runnable list respects the cap
        info = tk.info()
        assert info["overrides"]["max_isa"] == "avx2"
        runnable = set(info["runnable"])
        assert runnable, "no kernel is runnable under max_isa=avx2"
        for name, k in KERNELS.items():
            allowed = set(k["required_isa"]) <= (X86_AVX2_SET & CPU_ISA)
            assert (name in runnable) == allowed, name
        for row in info["selection"]:
            for w in row["by_m"].values():
                assert "avx512" not in w and "avxvnni" not in w, row

    assert tk.get_overrides() == {"max_isa": "", "force": "", "exclude": ""}
    _, ran = _ran(_x(1), packed)
    best_m1 = tk.explain(packed, 1).winner
    assert ran == {best_m1: 1}


@pytest.mark.filterwarnings("ignore:.*repack")
@pytest.mark.parametrize("bits,zeros,bias", [(4, False, False), (3, True, True), (8, True, False),
                                             (1, True, True)])
def test_max_isa_reference_runs_the_scalar_kernel_bit_exactly(bits, zeros, bias):
    packed, _ = _weights(bits=bits, zeros=zeros, bias=bias, n=70)
    xs = {m: _x(m) for m in (1, 3, 5, 64, 130)}
    default = {m: _run(packed, x) for m, x in xs.items()}
    with tk.overrides(max_isa="reference"):
        portable, _ = _weights(bits=bits, zeros=zeros, bias=bias, n=70)  # target=None under the cap
        for m, x in xs.items():
            for p in (packed, portable):
                y, ran = _ran(x, p)
                assert ran and all(KERNELS[k]["isa"] == "scalar" for k in ran), (m, ran)
                assert torch.equal(y, default[m]), f"m={m}: reference differs from the default kernel"


@needs_avx2
def test_force_avx2_pattern_runs_an_avx2_kernel_for_gemv_and_gemm_shapes():
    packed, _ = _weights(bits=5, zeros=True, bias=False)
    for m in (1, 64):
        expected = _run(packed, _x(m))
        with tk.overrides(force="*avx2*"):
            w = tk.explain(packed, m).winner
            assert KERNELS[w]["isa"] == "avx2" and "(forced)" in [
                c for c in tk.explain(packed, m).to_dict()["clusters"][0]["candidates"]
                if c["name"] == w][0]["reason"]
            y, ran = _ran(_x(m), packed)
        assert ran and all(KERNELS[k]["isa"] == "avx2" for k in ran), (m, ran)
        assert torch.equal(y, expected)


@needs_avx2
def test_force_pattern_matching_several_kernels_still_prefers_the_one_meant_for_m():
    with tk.overrides(force="*avx2*"):
        for m in BUCKET_MS:
            w = tk.explain("n16k4", m).winner
            k = KERNELS[w]
            assert k["m_min"] <= m and (k["m_max"] is None or k["m_max"] >= m), (m, w)


@needs_avx2
def test_forcing_one_kernel_packs_in_the_format_it_reads():
    # A kernel meant for some m only still decides the format (it runs any m
    # when forced); quantize_ must not pack a format it cannot read.
    gemv = "qd8_f32_qbwn16k4_gemv_1x32__avx2"
    with tk.overrides(force=gemv):
        model = torch.nn.Sequential(torch.nn.Linear(64, 64))
        tk.quantize_(model, bits=4, group_size=32)
        assert model[0].format == "n16k4"
        for m in (1, 128):
            assert model(_x(m)[:, :64]).shape == (m, 64)
            assert tk.explain(model[0].packed_weights, m).winner == gemv
    # no kernel left for any format: packing says why instead of picking one
    with tk.overrides(exclude="*"):
        with pytest.raises(ValueError, match=r"no packed format has a kernel to run here: .*exclude='\*'"):
            tk.pack(*tk.quantize_weight(torch.randn(16, 64), 4, 32, method="rtn")[:2], bits=4, group_size=32)
        assert tk.info()["best_format"].startswith("none (")
    with pytest.raises(ValueError, match="weight_nbit must be in 1..8, got 9"):
        tk.explain("n16k4", 1, bits=9)
    for kw, message in ((dict(m=1.7), "m must be an int, got 1.7"), (dict(bits=4.5), "bits must be an int"),
                        (dict(zeros="no"), "zeros must be True or False"), (dict(cpu=123), "cpu must be a fake CPU"),
                        (dict(threads="2"), "threads must be an int")):
        with pytest.raises(TypeError, match=message):
            tk.explain("n16k4", **{"m": 1, **kw})
    with pytest.raises(TypeError, match="the first argument must be packed weights"):
        tk.explain(123)


def test_override_patterns_that_match_no_kernel_are_errors():
    before = tk.get_overrides()
    # a typo'd exclude would otherwise exclude nothing, silently
    for kw, name in ((dict(exclude="gemv_1x32__avx3"), "exclude"), (dict(force="nope"), "force"),
                     (dict(exclude="avx2, no_such_kernel"), "exclude")):
        with pytest.raises(ValueError, match=rf"{name} pattern '(gemv_1x32__avx3|nope|no_such_kernel)' matches no kernel"):
            tk.set_overrides(**kw)
        assert tk.get_overrides() == before  # a refused setting changes nothing
    # a list of patterns is the comma-separated string
    with tk.overrides(exclude=["avx512", "*prefetch*"]):
        assert tk.get_overrides()["exclude"] == "avx512,*prefetch*"
        for m in (1, 2, 64):
            w = tk.explain("n16k4", m).winner
            assert w and "avx512" not in w and "prefetch" not in w, (m, w)
    with pytest.raises(TypeError, match="exclude must be a string or a list of strings"):
        tk.set_overrides(exclude=["avx2", 3])
    with pytest.raises(TypeError, match="max_isa must be a string or None"):
        tk.set_overrides(max_isa=["avx2"])


def test_exclude_removes_kernels_from_explain_and_the_op():
    packed, _ = _weights(bits=4)
    expected = {m: _run(packed, _x(m)) for m in (1, 64)}
    with tk.overrides(exclude="avx512"):
        for cpu in (None, "zen4", "skylake-x", "haswell", "alder-lake"):
            for fmt in FORMATS:
                for m in BUCKET_MS:
                    e = tk.explain(fmt, m, cpu=cpu).to_dict()
                    for c in e["clusters"]:
                        assert c["winner"] and "avx512" not in c["winner"], (cpu, fmt, m, c["winner"])
                        for cand in c["candidates"]:
                            if "avx512" in cand["name"]:
                                assert not cand["eligible"]
        for m in (1, 64):
            y, ran = _ran(_x(m), packed)
            assert ran and not any("avx512" in k for k in ran), ran
            assert torch.equal(y, expected[m])


def test_forcing_a_kernel_the_cpu_lacks_names_the_missing_isa():
    nonrunnable = [k for k in KERNELS.values() if k["compiled"] and not k["runnable"] and k["op"] == "linear"]
    if nonrunnable:
        # On this CPU: the op refuses, naming what is missing.
        k = nonrunnable[0]
        missing = set(k["required_isa"]) - CPU_ISA
        packed, _ = _weights(bits=4, target=k["format"])
        with tk.overrides(force=k["name"]):
            with pytest.raises(RuntimeError) as ei:
                _run(packed, _x(1))
        msg = str(ei.value)
    else:
        # Every compiled kernel runs here: show the same error on a fake CPU.
        k, cpu, missing = None, None, None
        build_arch = tk.cpu_descriptor("detected")["arch"]
        for cand in (c for c in KERNELS.values() if c["compiled"]):
            for fake in (f for f in FAKE_CPUS if tk.cpu_descriptor(f)["arch"] == build_arch):
                lacks = set(cand["required_isa"]) - set(tk.cpu_descriptor(fake)["isa"])
                if cand["required_isa"] and lacks:
                    k, cpu, missing = cand, fake, lacks
                    break
            if k:
                break
        assert k is not None, "no fake CPU lacks the ISA of any compiled kernel"
        with tk.overrides(force=k["name"]):
            e = tk.explain(k["format"], 1, cpu=cpu).to_dict()
        assert all(c["winner"] is None for c in e["clusters"])
        msg = e["clusters"][0]["error"]
        assert cpu in msg
    assert k["name"] in msg
    for feature in missing:
        assert feature in msg, (feature, msg)
    assert "lacks" in msg


@needs_avx2
def test_forcing_a_kernel_above_max_isa_fails_at_the_op_naming_the_features():
    strong = [k for k in KERNELS.values()
              if k["runnable"] and set(k["required_isa"]) - X86_AVX2_SET and k["op"] == "linear"]
    if not strong:
        pytest.skip("this CPU runs no kernel above avx2")
    k = strong[0]
    packed, _ = _weights(bits=4, target=k["format"])
    with tk.overrides(max_isa="avx2", force=k["name"]):
        with pytest.raises(RuntimeError) as ei:
            _run(packed, _x(1))
    msg = str(ei.value)
    assert k["name"] in msg and "max_isa=avx2" in msg
    for feature in set(k["required_isa"]) - X86_AVX2_SET:
        assert feature in msg, msg
    # the failed selection was not cached: defaults work again
    assert _run(packed, _x(1)).shape == (1, 96)


def test_invalid_max_isa_raises_value_error_listing_the_levels():
    before = tk.get_overrides()
    for bad in ("avx9000", "AVX2", " avx2"):
        with pytest.raises(ValueError) as ei:
            tk.set_overrides(max_isa=bad)
        msg = str(ei.value)
        assert repr(bad) in msg or f"'{bad}'" in msg
        for level in tk.isa_levels():
            assert level in msg, (level, msg)
        with pytest.raises(ValueError):
            with tk.overrides(max_isa=bad):
                pass
    assert tk.get_overrides() == before


# ---------------------------------------------------------------------------
# Environment variables (read once, at the first use of the selector)

_ENV_SCRIPT = textwrap.dedent("""
    import json, sys, torch, torchao_kernels as tk
    out = {}
    try:
        out["overrides"] = tk.get_overrides()
    except Exception as e:
        out["overrides_error"] = [type(e).__name__, str(e)]
    packed = torch.load(sys.argv[1])
    info = tk.packed_info(packed)
    for m in (1, 64):
        x = torch.randn(m, info["k"], generator=torch.Generator().manual_seed(m))
        tk.reset_stats()
        try:
            y = tk.linear(x, packed, info["group_size"], info["n"], info["k"])
            out[str(m)] = {"stats": tk.stats(), "y": y.tolist()}
        except Exception as e:
            out[str(m)] = {"error": [type(e).__name__, str(e)]}
    try:
        tk.pack(*tk.quantize_weight(torch.randn(32, 64), 4, 32), bits=4, group_size=32)
        out["pack"] = "ok"
    except Exception as e:
        out["pack"] = [type(e).__name__, str(e)]
    tk.set_overrides()  # recovers from a bad environment value
    x = torch.randn(1, info["k"])
    out["after_reset"] = list(tk.linear(x, packed, info["group_size"], info["n"], info["k"]).shape)
    print("RESULT " + json.dumps(out))
""")


@pytest.fixture(scope="module")
def env_case(tmp_path_factory):
    path = tmp_path_factory.mktemp("env") / "packed.pt"
    packed, _ = _weights(bits=4, n=40, zeros=True, bias=True, target="n16k4")
    torch.save(packed, path)
    expected = {}
    tk.set_overrides()
    for m in (1, 64):
        x = torch.randn(m, 256, generator=torch.Generator().manual_seed(m))
        expected[str(m)] = _run(packed, x)

    def run(**env_vars):
        env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHAO_KERNELS_") or k == "TORCHAO_KERNELS_TUNING"}
        env.update(env_vars)
        p = subprocess.run([sys.executable, "-c", _ENV_SCRIPT, str(path)], env=env,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, f"rc={p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
        line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        assert line, p.stdout + p.stderr
        return json.loads(line[-1][len("RESULT "):])

    return run, expected


def _check_ran(out, expected, pred):
    for m in ("1", "64"):
        assert "error" not in out[m], out[m]
        ran = out[m]["stats"]
        assert ran and all(pred(k) for k in ran), (m, ran)
        assert torch.equal(torch.tensor(out[m]["y"]), expected[m]), f"m={m}"


@needs_avx2
def test_env_max_isa(env_case):
    run, expected = env_case
    out = run(TORCHAO_KERNELS_MAX_ISA="avx2")
    assert out["overrides"] == {"max_isa": "avx2", "force": "", "exclude": ""}
    _check_ran(out, expected, lambda k: KERNELS[k]["isa"] == "avx2")
    assert out["pack"] == "ok"


@needs_avx2
def test_env_force(env_case):
    run, expected = env_case
    out = run(TORCHAO_KERNELS_FORCE="*gemm_4x16__avx2")
    assert out["overrides"] == {"max_isa": "", "force": "*gemm_4x16__avx2", "exclude": ""}
    _check_ran(out, expected, lambda k: k == "qd8_f32_qbwn16k4_gemm_4x16__avx2")


def test_env_exclude(env_case):
    run, expected = env_case
    out = run(TORCHAO_KERNELS_EXCLUDE="avx512, avxvnni")
    assert out["overrides"] == {"max_isa": "", "force": "", "exclude": "avx512, avxvnni"}
    _check_ran(out, expected, lambda k: "avx512" not in k and "avxvnni" not in k)


def test_env_exclude_naming_no_kernel_is_a_clear_error_at_first_use(env_case):
    run, expected = env_case
    out = run(TORCHAO_KERNELS_EXCLUDE="avx2,gemv_1x23")
    for where in (out["overrides_error"], out["1"]["error"], out["pack"]):
        kind, msg = where
        assert kind == "ValueError", where
        assert "TORCHAO_KERNELS_EXCLUDE" in msg and "'gemv_1x23' matches no kernel" in msg, msg
    assert out["after_reset"] == [1, 40]


def test_env_bogus_max_isa_is_a_clear_error_at_first_use(env_case):
    run, expected = env_case
    out = run(TORCHAO_KERNELS_MAX_ISA="bogus")  # import itself must succeed (rc == 0)
    for where in (out["overrides_error"], out["1"]["error"], out["64"]["error"], out["pack"]):
        kind, msg = where
        assert kind == "ValueError", where
        assert "TORCHAO_KERNELS_MAX_ISA" in msg and "'bogus'" in msg, msg
        assert all(level in msg for level in tk.isa_levels()), msg
    assert out["after_reset"] == [1, 40]


# ---------------------------------------------------------------------------
# Thread safety of first calls


def test_first_calls_from_many_threads_agree_with_single_threaded_results():
    packed, _ = _weights(bits=4, n=256, zeros=True, bias=True)
    ms = (1, 5, 64)
    xs = {m: _x(m, seed=m) for m in ms}
    expected = {m: _run(packed, x) for m, x in xs.items()}
    kernels_for = {m: set(_winners(tk.explain(packed, m))) for m in ms}
    n_threads, rounds, iters = 8, 4, 12

    for _ in range(rounds):
        tk.set_overrides()  # resets the selection cache: the next calls race to fill it
        tk.reset_stats()
        barrier = threading.Barrier(n_threads)
        failures = []

        def worker(tid):
            try:
                barrier.wait()
                for i in range(iters):
                    m = ms[(tid + i) % len(ms)]
                    y = _run(packed, xs[m])
                    if not torch.equal(y, expected[m]):
                        failures.append((tid, i, m))
            except Exception as e:  # noqa: BLE001 - reported below
                failures.append((tid, repr(e)))

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not failures, failures

        calls = {m: sum(1 for t in range(n_threads) for i in range(iters)
                        if ms[(t + i) % len(ms)] == m) for m in ms}
        ran = tk.stats()
        assert sum(ran.values()) == n_threads * iters, ran
        allowed = set().union(*kernels_for.values())
        assert set(ran) <= allowed, (ran, kernels_for)
        if all(len(v) == 1 for v in kernels_for.values()):
            want = {}
            for m in ms:
                (k,) = kernels_for[m]
                want[k] = want.get(k, 0) + calls[m]
            assert ran == want


# ---------------------------------------------------------------------------
# Heterogeneous CPUs


@pytest.mark.parametrize("cpu", ["alder-lake", "big-little-x2-a710-a510"])
def test_heterogeneous_cpu_has_one_winner_per_cluster_reading_one_format(cpu):
    d = tk.cpu_descriptor(cpu)
    assert len(d["clusters"]) > 1
    assert len({c["uarch_class"] for c in d["clusters"]}) > 1
    for fmt in FORMATS:
        for m in BUCKET_MS:
            for bits, zeros in ((4, False), (2, True), (8, True)):
                e = tk.explain(fmt, m, cpu=cpu, bits=bits, zeros=zeros).to_dict()
                assert len(e["clusters"]) == len(d["clusters"])
                for i, (c, dc) in enumerate(zip(e["clusters"], d["clusters"])):
                    assert c["cluster"] == i and c["uarch"] == dc["uarch"] and c["cores"] == dc["cores"]
                    assert c["winner"], c["error"]
                read = {KERNELS[c["winner"]]["format"] for c in e["clusters"]}
                assert read == {fmt}, (cpu, fmt, m, read)
                assert e["winner"] == e["clusters"][0]["winner"]


# ---------------------------------------------------------------------------
# Foreign format: one-time warning, repack

_WARN_SCRIPT = textwrap.dedent("""
    import json, warnings, torch, torchao_kernels as tk
    w = torch.randn(64, 128, generator=torch.Generator().manual_seed(0))
    q, s, z = tk.quantize_weight(w, 4, 32, True)
    packed = tk.pack(q, s, z, bits=4, group_size=32, target="n1k4")
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        ys = [tk.linear(x, packed, 32, 64, 128) for _ in range(3)]
        ys.append(tk.linear(x[:1], packed, 32, 64, 128))
    native = tk.repack(packed)
    with warnings.catch_warnings(record=True) as rec2:
        warnings.simplefilter("always")
        y2 = tk.linear(x, native, 32, 64, 128)
    print("RESULT " + json.dumps({
        "warnings": [[w.category.__name__, str(w.message)] for w in rec],
        "warnings_after_repack": [str(w.message) for w in rec2],
        "format": tk.packed_info(native)["format"],
        "best": tk.best_format(4, zeros=True),
        "equal": all(torch.equal(y, ys[0]) for y in ys[:3]) and torch.equal(y2, ys[0]),
    }))
""")


@pytest.fixture(scope="module")
def foreign_format_run():
    if tk.best_format(4, zeros=True) == "n1k4":
        pytest.skip("n1k4 is this CPU's best format: nothing to warn about")
    # A fresh process: the warning is once per process and format.
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHAO_KERNELS_") or k == "TORCHAO_KERNELS_TUNING"}
    p = subprocess.run([sys.executable, "-c", _WARN_SCRIPT], env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads([ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")][-1][7:])
    out["stderr"] = p.stderr
    return out


_REPACK_HINT = "torchao_kernels.repack("


def test_foreign_format_warns_once_with_a_python_user_warning(foreign_format_run):
    out = foreign_format_run
    repack_warnings = [w for w in out["warnings"] if "repack" in w[1]]
    assert len(repack_warnings) == 1, out["warnings"]
    kind, msg = repack_warnings[0]
    assert kind == "UserWarning"
    assert "n1k4" in msg and out["best"] in msg and _REPACK_HINT in msg, msg


def test_foreign_format_message_appears_once_and_repack_converts_it(foreign_format_run):
    out = foreign_format_run
    # Wherever the warning goes (Python warning or C++ log on stderr), it is
    # emitted exactly once for four calls, names both formats and the fix.
    msgs = [w[1] for w in out["warnings"] if _REPACK_HINT in w[1]]
    msgs += [ln for ln in out["stderr"].splitlines() if _REPACK_HINT in ln]
    assert len(msgs) == 1, (out["warnings"], out["stderr"])
    assert "n1k4" in msgs[0] and out["best"] in msgs[0], msgs[0]
    assert out["warnings_after_repack"] == []
    assert out["format"] == out["best"]
    assert out["equal"]


@pytest.mark.filterwarnings("ignore:.*repack")
@pytest.mark.parametrize("bits,zeros,bias", [(4, False, False), (2, True, True), (7, True, False)])
def test_repack_to_best_format_gives_identical_results(bits, zeros, bias):
    portable, (q, s, z, b) = _weights(bits=bits, n=37, zeros=zeros, bias=bias, target="n1k4")
    assert tk.packed_info(portable)["format"] == "n1k4"
    native = tk.repack(portable)
    info = tk.packed_info(native)
    assert info["format"] == tk.best_format(bits, zeros=zeros, bias=bias)
    assert (info["bits"], info["n"], info["k"], info["has_zeros"], info["has_bias"]) == (
        bits, 37, 256, zeros, bias)
    uq, us, uz, ub = tk.unpack(native)
    assert torch.equal(uq, q) and torch.equal(us, s.reshape(us.shape))
    assert (uz is None) == (z is None) and (z is None or torch.equal(uz, z))
    assert (ub is None) == (b is None) and (b is None or torch.equal(ub, b))
    for m in (1, 5, 64):
        assert torch.equal(_run(native, _x(m)), _run(portable, _x(m))), m
    # and back: repack to the portable format round-trips byte for byte
    assert torch.equal(tk.repack(native, "n1k4"), portable)


# ---------------------------------------------------------------------------
# The selection cache's bound on core clusters (kernels/select/selector.h)

_CACHE_PROBE = r"""
#include <cstdio>
#include <stdexcept>
#include "kernels/select/selector.h"
using namespace torchao_kernels;
int main() {
  CpuDescriptor d = fake_cpu("alder-lake");
  d.name = "many-clusters";
  d.clusters.clear();
  for (int i = 0; i <= kMaxCpuClusters; ++i)
    d.clusters.push_back(CoreCluster{i ? "gracemont" : "golden-cove",
                                     i ? UarchClass::kX86Little : UarchClass::kX86Big, 2});
  try {
    check_selection_cache_fits(d);
    std::printf("accepted\n");
  } catch (const std::invalid_argument& e) {
    std::printf("rejected: %s\n", e.what());
  }
  const std::vector<int> index = fit_clusters_to_selection_cache(d);
  check_selection_cache_fits(d);
  std::printf("merged: %zu clusters, last into %d, name %s\n", d.clusters.size(), index.back(),
              d.name.c_str());
}
"""


def test_every_fake_cpu_fits_the_selection_cache():
    for cpu in FAKE_CPUS:
        assert 1 <= len(tk.cpu_descriptor(cpu)["clusters"]) <= 8, cpu
        torch.ops.torchao_kernels._set_active_cpu(cpu)
        torch.ops.torchao_kernels._set_active_cpu(None)


def test_descriptor_with_too_many_clusters_is_refused(tmp_path):
    """A descriptor with more core clusters than the cache indexes is refused naming the
    count and the limit (never folded onto another cluster's slot); a detected CPU's
    surplus clusters are merged into one of the same class instead. Built against the
    torch-free kernel library of this build tree."""
    import glob
    import shutil

    root = Path(__file__).parent.parent
    libs = glob.glob(str(root / "build" / "*" / "libtk_kernels.a"))
    gxx = shutil.which("g++")
    if not libs or not gxx:
        pytest.skip("needs g++ and the build tree's libtk_kernels.a (pip install -e .)")
    src = tmp_path / "probe.cpp"
    src.write_text(_CACHE_PROBE)
    exe = tmp_path / "probe"
    torch_lib = Path(torch.__file__).parent / "lib"
    proc = subprocess.run([gxx, "-std=c++17", f"-I{root}", str(src), libs[0], f"-L{torch_lib}", "-lc10",
                           f"-Wl,-rpath,{torch_lib}", "-o", str(exe)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == ("rejected: CPU descriptor 'many-clusters' has 9 core clusters; "
                        "the selection cache indexes at most 8"), lines
    assert lines[1] == "merged: 8 clusters, last into 1, name many-clusters (9 core clusters merged into 8)", lines


def test_static_policy_follows_row_length_on_avx2():
    # On an AVX2-only part the GEMV that prefetches the next column step wins
    # over short rows and the plain GEMV over long ones (docs/benchmarks.md);
    # explain() without weights assumes long rows.
    plain, pf = "qd8_f32_qbwn16k4_gemv_1x32__avx2", "qd8_f32_qbwn16k4_gemv_1x32_prefetch__avx2"
    if plain not in KERNELS or pf not in KERNELS:
        pytest.skip("the AVX2 GEMV rows are not compiled into this build")

    def packed(n, k, bits):
        q, s, _ = tk.quantize_weight(torch.randn(n, k), bits, 32, False, method="rtn")
        return torch.ops.torchao.pack_8bit_act_xbit_weight(q, s, None, bits, 32, None, "n16k4")

    # At m = 2-3 the GEMVs give way to 4x16 tiles (one unpacking for the
    # rows): 1- to 4-bit weights to the in-register tile over short rows and
    # to the streaming one over longer rows; 8-bit weights to the in-register
    # tile at m = 2 and to the int16-panel tile at m = 3.
    i16 = "qd8p4x4i16_f32_qbwn16k4_gemm_4x16__avx2"
    tile, stream_tile = "qd8_f32_qbwn16k4_gemm_4x16__avx2", "qd8_f32_qbwn16k4_gemm_4x16_stream__avx2"
    for n, k, bits, rows, want in ((1536, 576, 4, "short-rows", pf), (512, 1024, 8, "medium-rows", pf),
                                   (256, 4096, 4, "long-rows", plain), (512, 2048, 8, "long-rows", plain)):
        for m in (1, 2, 3):
            e = tk.explain(packed(n, k, bits), m=m, cpu="zen3")
            w = want
            if m in (2, 3) and bits == 8:
                w = tile if m == 2 else i16
            elif m in (2, 3):
                w = tile if rows == "short-rows" else stream_tile
            if w not in KERNELS:
                w = want
            assert e["rows"] == rows and e["winner"] == w, (n, k, bits, m, e["rows"], e["winner"])
            assert f"/{rows}/" in e["clusters"][0]["class_key"]
    e = tk.explain("n16k4", m=1, cpu="zen3")
    assert e["rows"].startswith("long-rows") and e["winner"] == plain
    reasons = {c["name"]: c["reason"] for c in e["clusters"][0]["candidates"]}
    assert "- 10 with long rows" in reasons[pf]


def test_core_class_bonus_for_some_m_buckets_and_bit_widths_only():
    # On Zen 4 the 256-bit 4x16 tile wins m = 1 except over long rows and at
    # 1-2 bits (the prefetching 512-bit GEMV), and m = 2-3 over short rows at
    # every width and over long rows at 8 bits, and m = 2 over medium rows
    # from 3 bits (one unpacking for the rows since its tail rows run as one
    # tile); over long rows of 1-4 bits m = 2 takes the streaming 4x16 tile
    # and m = 3 the streaming 4x32 tile, over medium rows m = 3 the 4x32 tile
    # (at 2 bits the GEMV m = 1-2) (bonuses qualified by m, bit width and row length in the
    # manifest; bench --selection runs 63-71, docs/benchmarks.md); a Sapphire
    # Rapids class core takes the streaming 512-bit GEMV at m = 1
    # (test_intel_big_core_preferences), the streaming 4x32 tile at m = 2-3
    # and the 4x32 shared tile at m = 4-7. All on 1 thread (2
    # threads: test_core_class_bonus_for_a_thread_bucket_only).
    rows = {n: KERNELS.get(n) for n in ("qd8_f32_qbwn16k4_gemm_4x16__avx512vnni",
                                        "qd8_f32_qbwn16k4_gemv_1x64__avx512vnni",
                                        "qd8_f32_qbwn16k4_gemv_1x64_prefetch__avx512vnni",
                                        "qd8p4x4_f32_qbwn16k4_gemm_4x32__avx512vnni",
                                        "qd8p4x4_f32_qbwn16k4_gemm_4x32_shared__avx512vnni")}
    if None in rows.values():
        pytest.skip("the AVX512-VNNI rows are not compiled into this build")

    def packed(n, k, bits):
        q, s, _ = tk.quantize_weight(torch.randn(n, k), bits, 32, False, method="rtn")
        return torch.ops.torchao.pack_8bit_act_xbit_weight(q, s, None, bits, 32, None, "n16k4")

    short, long_, short2 = packed(1536, 576, 4), packed(256, 4096, 4), packed(1536, 576, 2)
    medium, short8 = packed(256, 2048, 4), packed(1536, 576, 8)
    medium2, long8 = packed(256, 4096, 2), packed(256, 2048, 8)
    want = {("zen4", "short", 1): "gemm_4x16__", ("zen4", "short", 2): "gemm_4x16__",
            ("zen4", "short", 3): "gemm_4x16__", ("zen4", "short", 8): "gemm_4x32__",
            ("zen4", "short8", 2): "gemm_4x16__", ("zen4", "short8", 3): "gemm_4x16__",
            ("zen4", "medium", 2): "gemm_4x16__", ("zen4", "medium", 3): "gemm_4x32__",
            ("zen4", "medium2", 2): "gemv_1x64_prefetch__", ("zen4", "medium2", 3): "gemm_4x32__",
            ("zen4", "long", 1): "gemv_1x64__", ("zen4", "long", 2): "gemm_4x16_stream__",
            ("zen4", "long", 3): "gemm_4x32_stream__", ("zen4", "long", 4): "gemm_4x32__",
            ("zen4", "long8", 2): "gemm_4x16__", ("zen4", "long8", 3): "gemm_4x16__",
            ("zen4", "short2", 1): "gemv_1x64_prefetch__", ("zen4", "short2", 2): "gemm_4x16__",
            ("zen4", "short2", 3): "gemm_4x16__",
            ("zen4", "short2", 4): "gemm_4x32__",
            ("sapphire-rapids", "short", 1): "gemv_1x64_stream__", ("sapphire-rapids", "short", 2): "gemm_4x32_stream__",
            ("sapphire-rapids", "short2", 2): "gemm_4x32_stream__", ("sapphire-rapids", "short2", 3): "gemm_4x32_stream__", ("sapphire-rapids", "short", 4): "gemm_4x32_shared__", ("sapphire-rapids", "short8", 1): "gemv_1x64_stream__",
            ("sapphire-rapids", "long", 1): "gemv_1x64_stream__", ("sapphire-rapids", "short", 8): "gemm_8x32_shared__"}
    layers = {"short": short, "long": long_, "short2": short2, "medium": medium, "short8": short8,
              "medium2": medium2, "long8": long8}
    for (cpu, rl, m), kernel in want.items():
        e = tk.explain(layers[rl], m=m, threads=1, cpu=cpu)
        assert e["winner"].split("qbwn16k4_")[1].startswith(kernel), (cpu, rl, m, e["winner"])
    pf = "qd8_f32_qbwn16k4_gemv_1x64_prefetch__avx512vnni"
    reasons = {c["name"]: c["reason"] for c in tk.explain(short2, m=2, threads=1, cpu="zen4")["clusters"][0]["candidates"]}
    assert "+ 11 on zen cores at m 1..2 for 1..2-bit weights" in reasons[pf], reasons[pf]
    reasons = {c["name"]: c["reason"] for c in tk.explain(short2, m=3, threads=1, cpu="zen4")["clusters"][0]["candidates"]}
    assert "on zen cores" not in reasons[pf], reasons[pf]
    reasons = {c["name"]: c["reason"] for c in tk.explain(short, m=2, threads=1, cpu="zen4")["clusters"][0]["candidates"]}
    assert "on zen cores" not in reasons[pf], reasons[pf]
    reasons = {c["name"]: c["reason"] for c in tk.explain(short, m=1, threads=1, cpu="zen4")["clusters"][0]["candidates"]}
    assert "+ 10 on zen cores at m 1..1" in reasons["qd8_f32_qbwn16k4_gemm_4x16__avx512vnni"]
    reasons = {c["name"]: c["reason"] for c in tk.explain(short, m=2, threads=1, cpu="zen4")["clusters"][0]["candidates"]}
    assert ("+ 23 on zen cores at m 2..3 with short rows (<= 576 weight bytes per output "
            "channel)") in reasons["qd8_f32_qbwn16k4_gemm_4x16__avx512vnni"]
    reasons = {c["name"]: c["reason"] for c in tk.explain(medium, m=2, threads=1, cpu="zen4")["clusters"][0]["candidates"]}
    assert ("+ 23 on zen cores at m 2..2 for 3..8-bit weights with medium rows"
            in reasons["qd8_f32_qbwn16k4_gemm_4x16__avx512vnni"])
    for layer in (medium2, long_):
        reasons = {c["name"]: c["reason"] for c in tk.explain(layer, m=2, threads=1, cpu="zen4")["clusters"][0]["candidates"]}
        assert "on zen cores" not in reasons["qd8_f32_qbwn16k4_gemm_4x16__avx512vnni"]
    # m = 4-7 with the weights from DRAM (a format name explains with DRAM
    # residency): the streaming 4x32 tile for 1-4 bits, not for 8 bits nor
    # with the weights in L2
    stream4x32 = "qd8p4x4_f32_qbwn16k4_gemm_4x32_stream__avx512vnni"
    for m in (4, 7):
        e = tk.explain("n16k4", m=m, threads=1, cpu="zen4")
        reasons = {c["name"]: c["reason"] for c in e["clusters"][0]["candidates"]}
        assert e["winner"] == stream4x32, (m, e["winner"])
        assert "+ 14 on zen cores at m 4..7 for 1..4-bit weights with the weights in dram" in reasons[stream4x32]
        assert tk.explain("n16k4", m=m, threads=1, cpu="zen4", bits=8)["winner"] != stream4x32
        assert tk.explain(long_, m=m, threads=1, cpu="zen4")["winner"] != stream4x32
    reasons = {c["name"]: c["reason"] for c in tk.explain(short, m=4, threads=1, cpu="zen4")["clusters"][0]["candidates"]}
    assert "on zen cores" not in reasons["qd8_f32_qbwn16k4_gemm_4x16__avx512vnni"]
    # 8-bit weights streamed from DRAM (a format name explains with unknown,
    # i.e. DRAM, residency) at m = 8-31: the 8x32 tile on Zen 4; 4-bit weights,
    # weights in the LLC (the 1536x576 layer) or m = 32 keep the 4x32 tile.
    for bits, m, kernel in ((8, 8, "gemm_8x32_shared__"), (8, 31, "gemm_8x32_shared__"),
                            (4, 8, "gemm_4x32__"), (8, 32, "gemm_4x32__")):
        e = tk.explain("n16k4", m=m, threads=1, cpu="zen4", bits=bits)
        assert e["winner"].split("qbwn16k4_")[1].startswith(kernel), (bits, m, e["winner"])
    e = tk.explain("n16k4", m=8, threads=1, cpu="zen4", bits=8)
    reasons = {c["name"]: c["reason"] for c in e["clusters"][0]["candidates"]}
    assert ("+ 6 on zen cores at m 8..31 for 8-bit weights with the weights in dram"
            in reasons["qd8p8x4_f32_qbwn16k4_gemm_8x32_shared__avx512vnni"])
    short8 = packed(1536, 576, 8)
    assert tk.explain(short8, m=8, threads=1, cpu="zen4")["winner"].startswith("qd8p4x4_f32_qbwn16k4_gemm_4x32__")


def test_core_class_bonus_for_a_thread_bucket_only():
    # On Zen 4 at 4 bits, m = 1 and 2 threads, the prefetching 512-bit GEMV
    # wins with the weights in DRAM: the manifest's bonus with threads = "2".
    # On 1 thread, in the LLC or L2, at m = 2 (the 4x16 tiles), at 8 bits and
    # on a Sapphire Rapids class core at 8 bits (the streaming GEMV) the
    # winners stay.
    pf = "qd8_f32_qbwn16k4_gemv_1x64_prefetch__avx512vnni"
    if pf not in KERNELS or "qd8_f32_qbwn16k4_gemm_4x16__avx512vnni" not in KERNELS:
        pytest.skip("the AVX512-VNNI rows are not compiled into this build")
    q, s, _ = tk.quantize_weight(torch.randn(1536, 576), 4, 32, False, method="rtn")
    short = torch.ops.torchao.pack_8bit_act_xbit_weight(q, s, None, 4, 32, None, "n16k4")  # 0.5 MB: in L2
    tile, stream_tile = "qd8_f32_qbwn16k4_gemm_4x16__avx512vnni", "qd8_f32_qbwn16k4_gemm_4x16_stream__avx512vnni"
    for layer, m, threads, cpu, bits, want in (
            ("n16k4", 1, 2, "zen4", 4, pf), ("n16k4", 2, 2, "zen4", 4, stream_tile),
            (short, 2, 2, "zen4", 4, tile), (short, 1, 2, "zen4", 4, tile),
            ("n16k4", 1, 1, "zen4", 4, "qd8_f32_qbwn16k4_gemv_1x64__avx512vnni"),
            ("n16k4", 2, 1, "zen4", 4, stream_tile),
            (short, 2, 1, "zen4", 4, tile),
            ("n16k4", 1, 2, "zen4", 8, "qd8_f32_qbwn16k4_gemv_1x64__avx512vnni"),
            ("n16k4", 3, 2, "zen4", 4, "qd8p4x4_f32_qbwn16k4_gemm_4x32_stream__avx512vnni"),
            ("n16k4", 1, 2, "sapphire-rapids", 8, "qd8_f32_qbwn16k4_gemv_1x64_stream__avx512vnni")):
        e = tk.explain(layer, m=m, threads=threads, cpu=cpu, bits=bits)
        assert e["winner"] == want, (layer if isinstance(layer, str) else "1536x576", m, threads, cpu, bits,
                                     e["winner"])
        assert f"/t{threads}/" in e["clusters"][0]["class_key"]
    reasons = {c["name"]: c["reason"] for c in tk.explain("n16k4", m=1, threads=2, cpu="zen4")["clusters"][0]["candidates"]}
    assert "+ 20 on zen cores at m 1..1 for 4-bit weights with the weights in dram on 2 threads" in reasons[pf], \
        reasons[pf]
    for m, threads in ((1, 1), (2, 2)):
        reasons = {c["name"]: c["reason"] for c in
                   tk.explain("n16k4", m=m, threads=threads, cpu="zen4")["clusters"][0]["candidates"]}
        assert "threads" not in reasons[pf], (m, threads, reasons[pf])
    row = next(k for k in tk.info()["kernels"] if k["name"] == pf)
    assert {"uarch_class": "zen", "bonus": 20, "m_min": 1, "m_max": 1, "bits_min": 4, "bits_max": 4,
            "residency": "dram", "groups": None, "rows": None, "threads": "2"} in row["uarch_prefs"]


def test_intel_big_core_preferences():
    # Measured on an Emerald Rapids core (bench --selection runs 29-31,
    # docs/benchmarks.md): at m = 1 the prefetching 512-bit GEMV for 1- to
    # 4-bit weights over any row length (since then, on a Granite
    # Rapids-class core, the streaming one ahead of it); for 8-bit weights
    # the in-register 8x32 tile at m >= 32; at m >= 128 over short rows
    # beyond L2 the 4x32 tile for every bit width; capped to AVX2, the
    # prefetching GEMV over long rows too (since then the streaming one) and
    # the 8-bit int16-panel tile at m = 2-3 over short rows (m = 3 since the
    # streaming GEMV). Zen cores keep their own choices.
    names = ("qd8_f32_qbwn16k4_gemv_1x64_prefetch__avx512vnni", "qd8p8x4_f32_qbwn16k4_gemm_8x32__avx512vnni",
             "qd8p4x4_f32_qbwn16k4_gemm_4x32__avx512vnni", "qd8_f32_qbwn16k4_gemv_1x32_prefetch__avx2",
             "qd8p4x4i16_f32_qbwn16k4_gemm_4x16__avx2")
    if any(KERNELS.get(n) is None for n in names):
        pytest.skip("the AVX2 and AVX512-VNNI rows are not compiled into this build")
    pf512, t8x32, t4x32, pf256, i16 = names
    stream512 = "qd8_f32_qbwn16k4_gemv_1x64_stream__avx512vnni"

    def packed(n, k, bits):
        q, s, _ = tk.quantize_weight(torch.randn(n, k), bits, 32, False, method="rtn")
        return torch.ops.torchao.pack_8bit_act_xbit_weight(q, s, None, bits, 32, None, "n16k4")

    def reasons(layer, m, **kw):
        e = tk.explain(layer, m=m, threads=1, cpu=kw.pop("cpu", "sapphire-rapids"), **kw)
        return e["winner"], {c["name"]: c["reason"] for c in e["clusters"][0]["candidates"]}

    # m = 1 (a format name: DRAM, long rows), and over short rows: since the
    # streaming GEMV's requests cross into the next column step (measured on
    # a Granite Rapids-class core) it is ahead of the prefetching one, which
    # keeps its Emerald Rapids bonus over the plain GEMV
    for layer in ("n16k4", packed(1536, 576, 4)):
        for bits in (2, 4, 8):
            w, r = reasons(layer, 1, bits=bits)
            assert w == stream512, (bits, w)
            assert "+ 22 on x86_big cores at m 1..2" in r[stream512], r[stream512]
            if bits <= 4:
                assert "+ 16 on x86_big cores at m 1..1 for 1..4-bit weights" in r[pf512], r[pf512]
    # m = 2-3: the streaming 4x32 tile (one unpacking for the rows, each
    # block's lines requested ahead), ahead of the streaming GEMV (which
    # took up to 1.22x the 4x32 tile's time from DRAM at m = 2 in bench
    # --selection run 48) and the 4x32 tile
    stream4x32 = "qd8p4x4_f32_qbwn16k4_gemm_4x32_stream__avx512vnni"
    for m in (2, 3):
        for bits in (2, 4, 8):
            w, r = reasons("n16k4", m, bits=bits)
            assert w == stream4x32, (m, bits, w)
            assert "+ 23 on x86_big cores at m 2..3" in r[stream4x32], r[stream4x32]
    # Zen 4 over long rows at 4 bits: the streaming 4x16 tile at m = 2, this
    # tile at m = 3 (its own zen bonus)
    w, r = reasons("n16k4", 2, bits=4, cpu="zen4")
    assert w == "qd8_f32_qbwn16k4_gemm_4x16_stream__avx512vnni", w
    w, r = reasons("n16k4", 3, bits=4, cpu="zen4")
    assert w == stream4x32 and "+ 16 on zen cores at m 3..3 for 1..4-bit weights" in r[stream4x32], r[stream4x32]
    assert reasons("n16k4", 1, bits=4)[0] == stream512
    assert reasons("n16k4", 4, bits=4)[0] != stream4x32
    # 8-bit weights at m >= 32: the in-register 8x32 tile; 4-bit keeps the shared one
    w, r = reasons("n16k4", 32, bits=8)
    assert w == t8x32 and "+ 2 on x86_big cores at m 32..inf for 8-bit weights" in r[t8x32], r[t8x32]
    assert reasons("n16k4", 16, bits=8)[0] == "qd8p8x4_f32_qbwn16k4_gemm_8x32_shared__avx512vnni"
    assert reasons("n16k4", 32, bits=4)[0] == "qd8p8x4_f32_qbwn16k4_gemm_8x32_shared__avx512vnni"
    # m >= 128, short rows beyond L2 (a 27 MiB 8-bit 49152x576 head does not
    # fit the fake CPU's L2; 1536x576 does): the 4x32 tile, at every bit width
    head8, small8, head4 = packed(49152, 576, 8), packed(1536, 576, 8), packed(49152, 576, 4)
    for layer in (head8, head4):
        w, r = reasons(layer, 128)
        assert w == t4x32, w
        assert "+ 4 on x86_big cores at m 128..inf with the weights in llc with short rows" in r[t4x32], r[t4x32]
    assert reasons(head8, 64)[0] == t8x32
    assert reasons(head4, 64)[0] == "qd8p8x4_f32_qbwn16k4_gemm_8x32_shared__avx512vnni"
    assert reasons(small8, 128)[0] == t8x32
    assert reasons(packed(1536, 576, 4), 128)[0] == "qd8p8x4_f32_qbwn16k4_gemm_8x32_shared__avx512vnni"
    # capped to AVX2: the streaming GEMV at m = 1-2 (a Granite Rapids-class
    # core: 4096x4096 from DRAM 1.26-1.36x faster than the prefetching one,
    # 49152x576 1.2x; at m = 2 over short 8-bit rows level with the int16-panel
    # tile, which keeps m = 3; docs/benchmarks.md)
    stream256 = "qd8_f32_qbwn16k4_gemv_1x32_stream__avx2"
    with tk.overrides(max_isa="avx2"):
        for bits in (4, 8):
            w, r = reasons("n16k4", 1, bits=bits)
            assert w == stream256, (bits, w)
            assert "+ 7 on x86_big cores at m 1..2" in r[stream256], r[stream256]
            assert "+ 10 on x86_big cores with long rows" in r[pf256], r[pf256]
        # m = 3, 1- to 4-bit weights: the streaming 4x16 tile (one
        # unpacking for the three rows), then the streaming GEMV (run 54:
        # the prefetching GEMV 1.06-1.37x its time in all 32 cold points)
        stream_tile = "qd8_f32_qbwn16k4_gemm_4x16_stream__avx2"
        for layer, kw in (("n16k4", {"bits": 2}), (packed(1536, 576, 4), {}), (packed(576, 576, 2), {})):
            w, r = reasons(layer, 3, **kw)
            assert w == stream_tile, w
            assert "+ 9 on x86_big cores at m 3..3 for 1..4-bit weights" in r[stream_tile], r[stream_tile]
            assert "+ 7 on x86_big cores at m 3..3 for 1..4-bit weights" in r[stream256], r[stream256]
            # a Zen core too over long rows (Zen 4 capped to AVX2, bench
            # --selection runs 62, 64 and 67), with its own bonus; over short
            # rows there the in-register tile
            w, r = reasons(layer, 3, cpu="zen3", **kw)
            assert "+ 8 on zen cores at m 2..3 for 1..4-bit weights" in r[stream_tile], r[stream_tile]
            assert w == (stream_tile if layer == "n16k4" else "qd8_f32_qbwn16k4_gemm_4x16__avx2"), w
        # m = 2: the streaming tile for 1- to 2-bit weights only
        w, r = reasons(packed(576, 576, 2), 2)
        assert w == stream_tile and "+ 9 on x86_big cores at m 2..2 for 1..2-bit weights" in r[stream_tile], w
        assert reasons(packed(576, 576, 4), 2)[0] == stream256
        short8 = packed(1536, 576, 8)
        w, r = reasons(short8, 3)
        assert w == i16, w
        assert "+ 4 on x86_big cores at m 2..3" in r[i16], r[i16]
        # on a Zen core at m = 3; at m = 2 the in-register nibble-split tile
        assert reasons(short8, 3, cpu="zen3")[0] == i16
        assert reasons(short8, 2, cpu="zen3")[0] == "qd8_f32_qbwn16k4_gemm_4x16__avx2"
        for m in (1, 2):
            w, r = reasons(short8, m)
            assert w == stream256, (m, w)
            assert "short rows" not in r[stream256], r[stream256]
        # Zen 3 keeps the plain GEMV over long rows
        assert reasons("n16k4", 1, bits=4, cpu="zen3")[0] == "qd8_f32_qbwn16k4_gemv_1x32__avx2"


def test_avxvnni_decode_preferences():
    # Measured on a Granite Rapids-class core capped to AVX-VNNI (bench
    # --selection runs 38, 42 and 43, docs/benchmarks.md): on Intel big cores
    # the plain 256-bit VNNI GEMV for 3- to 8-bit weights at every row length,
    # the prefetching one for 1-2 bits over rows of at most 1024 bytes, the
    # 4x16 tile at m = 3 on one thread (4 bits; 2 bits over short rows; until
    # the streaming GEMV below); over longer rows the prefetching form yields
    # on every core, as the AVX2 one.
    # Later, on the same core (docs/benchmarks.md): the streaming GEMV at
    # m = 1-2 on big cores (4096x4096 from DRAM 1.2-1.3x faster than either;
    # over short rows too since its requests cross into the next column
    # step: 49152x576 2-bit 778 against 951 us), and at m = 3 for 1- to
    # 4-bit weights, where it beat the tile and both GEMVs (run 50).
    plain, pf = "qd8_f32_qbwn16k4_gemv_1x32__avxvnni", "qd8_f32_qbwn16k4_gemv_1x32_prefetch__avxvnni"
    stream = "qd8_f32_qbwn16k4_gemv_1x32_stream__avxvnni"
    if KERNELS.get(plain) is None:
        pytest.skip("the AVX-VNNI rows are not compiled into this build")

    def packed(n, k, bits):
        q, s, _ = tk.quantize_weight(torch.randn(n, k), bits, 32, False, method="rtn")
        return torch.ops.torchao.pack_8bit_act_xbit_weight(q, s, None, bits, 32, None, "n16k4")

    def reasons(layer, m, cluster=0, threads=1, **kw):
        e = tk.explain(layer, m=m, threads=threads, cpu="alder-lake", **kw)
        return e["clusters"][cluster]["winner"], {c["name"]: c["reason"]
                                                   for c in e["clusters"][cluster]["candidates"]}

    tile = "qd8_f32_qbwn16k4_gemm_4x16__avxvnni"
    short4, short2, long2 = packed(576, 576, 4), packed(576, 576, 2), packed(256, 8192, 2)
    short8, medium2 = packed(576, 576, 8), packed(256, 4096, 2)
    for m in (1, 2):
        w, r = reasons(short4, m)
        assert w == stream, (m, w)
        assert "+ 6 on x86_big cores for 3..8-bit weights" in r[plain], r[plain]
        assert reasons(short2, m)[0] == stream
    # m = 3: the streaming 4x16 tile for 1- to 4-bit weights on any thread
    # count and row length (one unpacking for the three rows; 4096x4096
    # 2-bit from DRAM 628 against the streaming GEMV's 809 us), the
    # streaming GEMV next (the plain 4x16 tile has no bonus there); the plain
    # GEMV keeps 8 bits; little cores keep the prefetching GEMV
    stream_tile = "qd8_f32_qbwn16k4_gemm_4x16_stream__avxvnni"
    for layer in (short4, short2, medium2, long2):
        for threads in (1, 2):
            w, r = reasons(layer, 3, threads=threads)
            assert w == stream_tile, (threads, w)
            assert "+ 9 on x86_big cores at m 3..3 for 1..4-bit weights" in r[stream_tile], r[stream_tile]
            assert "+ 7 on x86_big cores at m 3..3 for 1..4-bit weights" in r[stream], r[stream]
            assert "x86_big" not in r[tile], r[tile]
            # below the 512-bit 4x32 tile (38) of AVX512-VNNI cores
            assert tk.explain(layer, m=3, threads=threads, cpu="sapphire-rapids")["winner"] != stream_tile
    assert reasons(short8, 3)[0] == plain
    assert reasons(short2, 2)[0] == stream
    assert reasons(short4, 3, cluster=1)[0] == pf
    # 2-bit rows of 2048 bytes: long, where the prefetching form's malus
    # leaves the plain one ahead on the little cores too
    w, r = reasons(long2, 1, cluster=1)
    assert w == plain, w
    assert "- 10 with long rows" in r[pf], r[pf]
    # little cores over short rows keep the prefetching form
    assert reasons(short4, 1, cluster=1)[0] == pf
    # the streaming GEMV: big cores, m = 1-2, every row length
    for layer in (long2, medium2, short4, short2, short8):
        for m in (1, 2):
            w, r = reasons(layer, m)
            assert w == stream, (m, w)
            assert "+ 8 on x86_big cores at m 1..2" in r[stream], r[stream]
        assert reasons(layer, 1, cluster=1)[0] != stream
    w, r = reasons(short4, 1)
    assert w == stream and "short rows" not in r[stream], (w, r[stream])


def test_group_length_is_part_of_the_class():
    # Groups over the shared-unpack chunk's group (per-channel weights) are a
    # class of their own: on Zen cores capped to AVX2 the in-register 4x16
    # tile takes 1- to 4-bit weights in long groups at m = 8-31, where its
    # unpacking is nearly free; groups of 32 and m >= 32 keep the
    # shared-unpack tile; other cores keep it too. 8-bit weights take the
    # tiles over int16 panels for every group length (in registers below
    # m = 16, and at m = 16-31 for long groups, on every x86 core class).
    inreg, shared = "qd8_f32_qbwn16k4_gemm_4x16__avx2", "qd8p4x4_f32_qbwn16k4_gemm_4x16_shared__avx2"
    wide, wide_shared = ("qd8p4x4i16_f32_qbwn16k4_gemm_4x16__avx2",
                         "qd8p4x4i16_f32_qbwn16k4_gemm_4x16_shared__avx2")
    if KERNELS.get(inreg) is None or KERNELS.get(shared) is None:
        pytest.skip("the AVX2 rows are not compiled into this build")

    def packed(bits, group):
        q, s, _ = tk.quantize_weight(torch.randn(64, 1024), bits, group, False, method="rtn")
        return torch.ops.torchao.pack_8bit_act_xbit_weight(q, s, None, bits, group, None, "n16k4")

    want = {("zen3", 4, 1024, 8): inreg, ("zen3", 4, 1024, 31): inreg, ("zen3", 2, 1024, 16): inreg,
            ("zen3", 4, 1024, 32): shared, ("zen3", 8, 1024, 8): wide, ("zen3", 8, 32, 8): wide,
            ("zen3", 8, 1024, 16): wide, ("zen3", 8, 1024, 31): wide, ("haswell", 8, 1024, 24): wide,
            ("zen3", 8, 1024, 32): wide_shared, ("zen3", 8, 32, 16): wide_shared, ("haswell", 8, 32, 16): wide_shared,
            ("zen3", 8, 32, 128): wide_shared, ("zen3", 4, 512, 8): shared,
            ("zen3", 4, 32, 8): shared, ("zen3", 4, 1024, 4): inreg, ("haswell", 4, 1024, 8): shared}
    bufs = {}
    for (cpu, bits, group, m), kernel in want.items():
        p = bufs.setdefault((bits, group), packed(bits, group))
        e = tk.explain(p, m=m, threads=1, cpu=cpu)
        assert e["winner"] == kernel, (cpu, bits, group, m, e["winner"])
        groups = "long-groups" if group > 512 else "short-groups"
        assert e["groups"] == groups and f"/{groups}/" in e["clusters"][0]["class_key"]
    e = tk.explain(bufs[(4, 1024)], m=8, threads=1, cpu="zen3")
    reasons = {c["name"]: c["reason"] for c in e["clusters"][0]["candidates"]}
    assert "+ 2 on zen cores at m 8..31 for 1..4-bit weights with long groups (> 512 values)" in reasons[inreg]
    assert "groups" not in reasons[shared]
    # Without a buffer the group length is unknown and counts as short.
    assert tk.explain("n16k4", m=8, cpu="zen3")["groups"] == "short-groups (assumed: no buffer given)"


def test_rows_for_short_groups_only_are_rejected_for_long_groups():
    # The 512-bit shared-unpack rows take groups of at most 512 values (their
    # L1 chunks); for long groups selection names the in-register tile that
    # runs (the 8x32 one above the 4x32 where no core-class bonus decides),
    # and a tuning table cannot pick them either (not runnable).
    shared = ["qd8p4x4_f32_qbwn16k4_gemm_4x32_shared__avx512vnni",
              "qd8p8x4_f32_qbwn16k4_gemm_8x32_shared__avx512vnni"]
    if any(KERNELS.get(n) is None for n in shared):
        pytest.skip("the AVX512-VNNI rows are not compiled into this build")
    assert all(not KERNELS[n]["long_groups"] for n in shared)
    assert KERNELS["qd8p8x4_f32_qbwn16k4_gemm_8x32__avx512vnni"]["long_groups"]

    def packed(group):
        q, s, _ = tk.quantize_weight(torch.randn(64, 1024), 4, group, False, method="rtn")
        return torch.ops.torchao.pack_8bit_act_xbit_weight(q, s, None, 4, group, None, "n16k4")

    short, long_ = packed(32), packed(1024)
    want = {("sapphire-rapids", 32, 4): "qd8p4x4_f32_qbwn16k4_gemm_4x32_shared__avx512vnni",
            ("sapphire-rapids", 1024, 4): "qd8p4x4_f32_qbwn16k4_gemm_4x32__avx512vnni",
            ("sapphire-rapids", 32, 16): "qd8p8x4_f32_qbwn16k4_gemm_8x32_shared__avx512vnni",
            ("sapphire-rapids", 1024, 16): "qd8p8x4_f32_qbwn16k4_gemm_8x32__avx512vnni",
            ("zen4", 1024, 16): "qd8p4x4_f32_qbwn16k4_gemm_4x32__avx512vnni"}
    for (cpu, group, m), kernel in want.items():
        e = tk.explain(short if group == 32 else long_, m=m, threads=1, cpu=cpu)
        assert e["winner"] == kernel, (cpu, group, m, e["winner"])
    e = tk.explain(long_, m=16, threads=1, cpu="sapphire-rapids")
    reasons = {c["name"]: c["reason"] for c in e["clusters"][0]["candidates"]}
    for n in shared:
        assert reasons[n] == "takes groups of at most 512 values (its L1 chunks), not long groups", reasons[n]
    # Forced onto long groups, such a row is an error naming why.
    with tk.overrides(force=shared[1]):
        err = tk.explain(long_, m=16, threads=1, cpu="sapphire-rapids")["clusters"][0]["error"]
        assert f"forced kernel {shared[1]} takes groups of at most 512 values" in err, err
        assert tk.explain(short, m=16, threads=1, cpu="sapphire-rapids")["winner"] == shared[1]
