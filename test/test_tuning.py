"""Measured selection: tuning tables (tune(), loading, validation, overrides,
first-use tuning) and bench --selection. Results never depend on the table."""
import json
import os
import subprocess
import sys
import warnings

import pytest
import torch

import torchao_kernels as tk
from torchao_kernels import tuning

_K = torch.ops.torchao_kernels
GS = 32


@pytest.fixture(autouse=True)
def _no_table_after():
    yield
    tk.set_tuning("0")
    tk.set_overrides()
    tk.reset_stats()


def _packed(n=64, k=128, bits=4, zeros=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g)
    q, s, z = tk.quantize_weight(w, bits, GS, zeros, method="rtn")
    return torch.ops.torchao.pack_8bit_act_xbit_weight(q, s, z if zeros else None, bits, GS, None, None)


def _cls(packed, m, threads=None):
    # the class a call at m rows falls in, at torch's thread count (as the op and explain() use)
    threads = torch.get_num_threads() if threads is None else threads
    return json.loads(_K._linear_class_json(packed, m, threads))


def _write(path, entries, **over):
    st = tk.tuning_status()
    d = {"schema": tuning.SCHEMA, "version": tuning.VERSION, "cpu_signature": st["cpu_signature"],
         "kernel_set": st["kernel_set"], "entries": entries}
    d.update(over)
    path.write_text(json.dumps(d))
    return path


def _linear(x, p, n, k):
    return torch.ops.torchao.linear_8bit_act_xbit_weight(x, p, GS, n, k)


def _non_static_runnable(c):
    others = [r for r in c["runnable"] if r != c["static"]]
    assert others, f"class {c['key']} has only one runnable row"
    return others[0]


def test_class_key_and_runnable_rows():
    p = _packed()
    c = _cls(p, 1)
    assert c["key"].startswith("linear/") and c["key"].endswith("/c0")
    assert "/b4/z0/bias0/m1/" in c["key"]
    assert c["residency"] == "l2"  # 4 KiB of weights
    assert c["static"] in c["runnable"] and c["selected"] == c["static"] and c["source"] == "static"
    # the reference row runs every class
    assert any(r.endswith("__scalar") for r in c["runnable"])
    assert _cls(p, 128, 2)["key"] != c["key"]
    assert "/t2/" in _cls(p, 128, 2)["key"] and "/m128+/" in _cls(p, 128)["key"]
    # A call too small to split (1 x 64 x 128, 4 KiB of weights) runs, and is
    # classed, on one thread; a large product or a large weight stream is split.
    assert _cls(p, 1, 2)["key"] == c["key"] and "/t1/" in c["key"]
    assert "/t2/" in _cls(_packed(512, 512), 1, 2)["key"]  # 128 KiB of 4-bit weights at m = 1
    # row length: k * bits / 8 bytes per output channel against 576 and 1024
    assert c["rows"] == "short-rows" and "/l2/short-rows/" in c["key"]
    for k, bits, rows in ((1152, 4, "short-rows"), (1216, 4, "medium-rows"), (2048, 4, "medium-rows"),
                          (2048, 8, "long-rows"), (4096, 4, "long-rows"), (4096, 2, "medium-rows")):
        got = _cls(_packed(16, k, bits), 1)
        assert got["rows"] == rows and f"/{rows}/" in got["key"], (k, bits, got)


def test_explain_shows_the_second_look(tmp_path):
    n, k = 64, 128
    p = _packed(n, k)
    c = _cls(p, 5)
    other = _non_static_runnable(c)
    # listed alphabetically in the file (tune writes with sort_keys): explain lists them fastest first
    entry = {"winner": c["static"], "times_us": {other: 9.0, c["static"]: 10.0},
             "confirm_us": {c["static"]: 10.2, other: 10.0}, "confirm_wins": {other: 0.4},
             "static": c["static"]}
    tk.set_tuning(_write(tmp_path / "t.json", {c["key"]: entry}))
    try:
        text = str(tk.explain(p, 5))
        assert tk.explain(p, 5).winner == c["static"]
        look = [line for line in text.splitlines() if "second look against the static choice" in line]
        assert len(look) == 1
        assert look[0].index(other) < look[0].index(c["static"])  # fastest first
        assert f"{other} 10.0 us (won 40% of rounds by the margin)" in look[0]
        assert f"{c['static']} 10.2 us" in look[0]
        measured = [line for line in text.splitlines() if line.startswith("  class ")][0]
        assert measured.index(other) < measured.index(c["static"])
        # a corrupt second look loses its rows, not the entry
        entry["confirm_us"] = {other: "fast", c["static"]: -1}
        tk.set_tuning(_write(tmp_path / "t2.json", {c["key"]: entry}))
        e = tk.explain(p, 5)
        assert e.source == "table" and "second look" not in str(e)
        # a name repeated in the file counts once, with its last value; a share above 1 is dropped
        st = tk.tuning_status()
        dup = ('{"schema": "%s", "version": %d, "cpu_signature": "%s", "kernel_set": "%s", "entries": '
               '{"%s": {"winner": "%s", "times_us": {"%s": 1.0}, '
               '"confirm_us": {"%s": 3.0, "%s": 4.0, "%s": 5.0}, "confirm_wins": {"%s": 0.5, "%s": 7.0}}}}'
               % (tuning.SCHEMA, tuning.VERSION, st["cpu_signature"], st["kernel_set"], c["key"], c["static"],
                  c["static"], other, other, c["static"], other, other))
        (tmp_path / "t3.json").write_text(dup)
        tk.set_tuning(tmp_path / "t3.json")
        look = [line for line in str(tk.explain(p, 5)).splitlines() if "second look" in line]
        assert len(look) == 1 and look[0].count(other) == 1 and f"{other} 4.0 us" in look[0]
        assert "won" not in look[0]
    finally:
        tk.set_tuning(False)


def test_hand_written_table_decides_and_results_are_identical(tmp_path):
    n, k = 64, 128
    p = _packed(n, k)
    x = torch.randn(5, k)
    static_out = _linear(x, p, n, k)
    c = _cls(p, 5)
    chosen = _non_static_runnable(c)
    path = _write(tmp_path / "t.json", {c["key"]: {"winner": chosen, "times_us": {chosen: 1.0, c["static"]: 2.0}}})
    tk.set_tuning(path)
    e = tk.explain(p, 5)
    assert e.winner == chosen and e.source == "table"
    assert "measured (tuning table" in str(e) and f"{chosen} 1.0 us" in str(e)
    assert f"the static policy would pick {c['static']}" in str(e)
    tk.reset_stats()
    out = _linear(x, p, n, k)
    assert torch.equal(out, static_out)
    assert tk.stats() == {chosen: 1}
    assert tk.tuning_status()["loaded"] and tk.tuning_status()["classes"] == 1
    # another class of the same weights stays with the static policy
    assert tk.explain(p, 1).source == "static"
    tk.set_tuning(False)
    assert tk.explain(p, 5).winner == c["static"]


def test_entry_that_kept_an_older_static_choice_yields_to_todays(tmp_path):
    # tune() keeps the static choice of its day unless a row beats it by the
    # override margin, so such an entry is no evidence against a static choice
    # the policy has made since: today's static choice runs, unless the
    # entry's own times put the old one ahead by that margin. An entry whose
    # winner beat the static choice of its day stays.
    n, k = 64, 128
    p = _packed(n, k)
    c = _cls(p, 5)
    old = _non_static_runnable(c)
    now = c["static"]
    margin = tuning.OVERRIDE_MARGIN

    def entry(old_us, now_us, **extra):
        return {c["key"]: dict({"winner": old, "static": old, "times_us": {old: old_us, now: now_us}}, **extra)}

    cases = [(entry(10.0, 10.0 * (1 + margin / 2)), now),   # a near tie: today's static choice
             (entry(10.0, 9.0), now),                       # today's choice measured faster
             (entry(10.0, 10.0 * (1 + 2 * margin)), old),   # the old choice clearly faster
             # the second look's times decide when it timed both rows
             (entry(10.0, 10.0 * (1 + 2 * margin), confirm_us={old: 10.0, now: 10.1}), now),
             # a winner that beat the static choice of its day is a measurement: kept
             ({c["key"]: {"winner": old, "static": now, "times_us": {old: 10.0, now: 10.1}}}, old)]
    for i, (entries, want) in enumerate(cases):
        tk.set_tuning(_write(tmp_path / f"t{i}.json", entries))
        e = tk.explain(p, 5)
        assert e.winner == want, (i, e.winner)
        assert e.source == ("static" if want == now else "table"), (i, e.source)
        if i < 2:
            assert f"the table kept {old}, the static choice when it was tuned" in str(e), str(e)
            assert f"the static policy now chooses {now}" in str(e)
        if i == 2:
            assert "the static choice when the class was tuned, more than" in str(e), str(e)
    # the op runs what explain() names, with the same bits
    x = torch.randn(5, k)
    tk.set_tuning(_write(tmp_path / "t0b.json", cases[0][0]))
    tk.reset_stats()
    out = _linear(x, p, n, k)
    assert tk.stats() == {now: 1}
    tk.set_tuning("0")
    assert torch.equal(out, _linear(x, p, n, k))


def test_every_runnable_row_gives_the_same_result():
    # Why a table can only change speed: every row of a class is bit-identical.
    for bits, zeros, m in [(2, False, 1), (4, True, 3), (8, False, 7), (3, True, 33)]:
        n, k = 48, 256
        p = _packed(n, k, bits, zeros, seed=bits)
        x = torch.randn(m, k)
        ref = _linear(x, p, n, k)
        for r in _cls(p, m)["runnable"]:
            assert torch.equal(_K._linear_forced(x, p, r), ref), (r, bits, zeros, m)


def test_overrides_win_over_the_table(tmp_path):
    n, k = 64, 128
    p = _packed(n, k)
    c = _cls(p, 4)
    chosen = _non_static_runnable(c)
    second = next(r for r in c["runnable"] if r != chosen)
    path = _write(tmp_path / "t.json", {c["key"]: {"winner": chosen, "times_us": {chosen: 1.0, second: 1.5}}})
    tk.set_tuning(str(path))
    assert tk.explain(p, 4).winner == chosen
    tk.set_overrides(exclude=chosen)
    e = tk.explain(p, 4)
    assert e.winner == second and e.source == "table"  # the fastest measured row still allowed
    assert "cannot run here" in str(e)
    tk.set_overrides(force=c["static"])
    assert tk.explain(p, 4).winner == c["static"]
    tk.set_overrides(max_isa="reference")
    assert tk.explain(p, 4).winner.endswith("__scalar")


def test_table_naming_rows_this_cpu_cannot_run(tmp_path):
    p = _packed()
    c = _cls(p, 1)
    info = tk.info()
    foreign = [kk["name"] for kk in info["kernels"] if kk["op"] == "linear" and not kk["runnable"]]
    if not foreign:
        pytest.skip("this CPU runs every compiled kernel")
    # the foreign row is the "winner"; the only runnable time listed is the static row's
    path = _write(tmp_path / "t.json", {c["key"]: {"winner": foreign[0], "times_us": {foreign[0]: 0.1}}})
    tk.set_tuning(path)
    e = tk.explain(p, 1)
    assert e.winner == c["static"] and e.source == "static"
    x = torch.randn(1, 128)
    assert torch.equal(_linear(x, p, 64, 128), _K._linear_forced(x, p, c["static"]))


def _warns_ignored(path, match):
    tk.set_tuning(path)
    p = _packed()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert tk.explain(p, 1).source == "static"
        tk.explain(p, 4)
        _linear(torch.randn(2, 128), p, 64, 128)
    msgs = [str(x.message) for x in w if "tuning table" in str(x.message)]
    assert len(msgs) == 1, msgs  # one warning, not one per selection
    assert match in msgs[0], msgs[0]
    assert "ignored" in tk.tuning_status()["status"]


def test_table_of_another_cpu_is_ignored_with_one_warning(tmp_path):
    p = _packed()
    c = _cls(p, 1)
    _warns_ignored(_write(tmp_path / "t.json", {c["key"]: {"winner": c["static"]}}, cpu_signature="other CPU"),
                   "measured on another CPU")


def test_table_of_another_kernel_set_is_ignored(tmp_path):
    _warns_ignored(_write(tmp_path / "t.json", {}, kernel_set="0123456789abcdef"),
                   "measured with another set of kernels")


HOSTILE = [
    b"",
    b"\x00\xff\xfe garbage",
    b"{" * 100000,
    b"[" * 50 + b"]" * 50,
    b'{"schema": "torchao_kernels.tuning", "version": 1e999}',
    b'{"schema": "torchao_kernels.tuning", "version": 1, "cpu_signature": 5}',
    b'{"schema": "torchao_kernels.tuning", "version": 2}',
    b'{"schema": "something else"}',
    b'{"schema": "torchao_kernels.tuning", "version": 1, "cpu_signature": "\\ud800"}',
    b'{"a": "' + b"x" * 100000 + b'"}',
    b'{"schema": "torchao_kernels.tuning", "version": 1, "cpu_signature": "x", "kernel_set": "y", '
    b'"entries": {"linear/n16k4": ' + b"[1," * 10 + b"]",
    b"[]",
    b"null",
    b'{"schema": "torchao_kernels.tuning"} trailing',
]


@pytest.mark.parametrize("content", HOSTILE, ids=range(len(HOSTILE)))
def test_corrupt_or_hostile_files_never_crash(tmp_path, content):
    path = tmp_path / "t.json"
    path.write_bytes(content)
    tk.set_tuning(path)
    p = _packed()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        e = tk.explain(p, 1)
        out = _linear(torch.randn(1, 128), p, 64, 128)
    assert e.source == "static" and e.winner == _cls(p, 1)["static"]
    assert out.shape == (1, 64)
    assert not tk.tuning_status()["loaded"]


def test_hostile_entries_are_filtered(tmp_path):
    p = _packed()
    c = _cls(p, 1)
    entries = {
        c["key"]: {"winner": "no_such_kernel", "times_us": {"no_such_kernel": 0.0}},
        "linear/../../etc": {"winner": c["static"], "times_us": {c["static"]: -5, "x": "y"}},
        "junk": [1, 2, 3],
    }
    tk.set_tuning(_write(tmp_path / "t.json", entries))
    assert tk.explain(p, 1).source == "static"
    st = tk.tuning_status()
    assert st["loaded"] and st["classes"] == 1 and "dropped" in st["status"]


def test_set_tuning_arguments():
    with pytest.raises(TypeError, match="set_tuning: table must be"):
        tk.set_tuning(12)
    with pytest.raises(ValueError, match="got ''"):
        tk.set_tuning("")
    tk.set_tuning(False)
    assert tk.tuning_status()["setting"] == "0" and "disabled" in tk.tuning_status()["status"]
    tk.set_tuning("/nonexistent/table.json")
    with pytest.warns(UserWarning, match="cannot be read"):
        tk.explain(_packed(), 1)


def test_tune_writes_a_table_selection_uses(tmp_path):
    path = tmp_path / "sub" / "table.json"
    threads = torch.get_num_threads()
    res = tk.tune(shapes=[(64, 128), (256, 256)], m=[1, 8], threads=[threads], path=path, progress=False,
                  min_time=0.002)
    d = json.loads(path.read_text())
    assert d["schema"] == tuning.SCHEMA and d["cpu_signature"] == tk.tuning_status()["cpu_signature"]
    p = _packed(64, 128)
    key = _cls(p, 1)["key"]
    assert key in d["entries"] and set(d["entries"]) == set(res.entries)
    e = d["entries"][key]
    assert e["regime"] == "cold" and d["entries"][_cls(p, 8)["key"]]["regime"] == "warm"
    # the fastest row, unless a second look (confirm_us) kept the static choice or ranked another first
    assert e["winner"] == tuning.confirmed_winner(e["times_us"], e.get("confirm_us", {}), e["static"],
                                                  wins=e.get("confirm_wins"))
    if "confirm_us" in e:  # each row of the second look but the static choice: its share of won rounds
        assert set(e["confirm_wins"]) == set(e["confirm_us"]) - {e["static"]}
        assert all(0.0 <= w <= 1.0 for w in e["confirm_wins"].values())
    if "confirm_us" not in e:
        assert e["winner"] == min(e["times_us"], key=e["times_us"].get)
    # every point of the class was timed: both shapes at m = 1 (their residency is the same)
    if _cls(_packed(256, 256), 1)["key"] == key:
        assert sorted(e["points"]) == ["256x256 m=1", "64x128 m=1"]
    # every row tune races (within range_factor of its m range), except the
    # portable reference where a SIMD row may run
    raced = _cls(p, 1)["raced"]
    simd = [r for r in raced if not r.endswith("__scalar")]
    assert set(e["times_us"]) == set(simd or raced)
    # tune() switched selection to the new table
    assert tk.tuning_status()["path"] == str(path)
    assert tk.explain(p, 1).winner == e["winner"] and tk.explain(p, 1).source == "table"
    # merge keeps other classes; --no-merge replaces
    tk.tune(shapes=[(64, 128)], m=[2], threads=[threads], path=path, progress=False, min_time=0.002)
    assert set(res.entries) <= set(json.loads(path.read_text())["entries"])
    tk.tune(shapes=[(64, 128)], m=[2], threads=[threads], path=path, progress=False, min_time=0.002, merge=False)
    assert len(json.loads(path.read_text())["entries"]) == 1
    # the two shapes fall into the same classes when their residency is the same
    keys = {_cls(pp, m)["key"] for pp in (p, _packed(256, 256)) for m in (1, 8)}
    assert set(res.entries) == keys
    assert "winner" in str(res) and f"tuned {len(keys)} classes" in str(res)


def test_tune_model_and_arguments(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(128, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
    tk.quantize_(model, bits=4, group_size=32, method="rtn", progress=False)
    res = tk.tune(model, m=[1], path=tmp_path / "m.json", progress=False, min_time=0.002)
    assert len(res.entries) >= 1
    with pytest.raises(ValueError, match="no QuantizedLinear"):
        tk.tune(torch.nn.Sequential(torch.nn.ReLU()), path=tmp_path / "x.json")
    with pytest.raises(ValueError, match="budget must be a positive"):
        tk.tune(shapes=[(64, 128)], budget=-1, path=tmp_path / "x.json")
    with pytest.raises(ValueError, match="threads must be positive"):
        tk.tune(shapes=[(64, 128)], threads=0, path=tmp_path / "x.json")
    with pytest.raises(ValueError, match="model or shapes"):
        tk.tune(model, shapes=[(64, 128)])


def _run(code, **env):
    e = {k: v for k, v in os.environ.items() if not k.startswith("TORCHAO_KERNELS_")}
    e.update(env)
    r = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


PROBE = """
import json, torch, torchao_kernels as tk
w = torch.randn(64, 128)
q, s, _ = tk.quantize_weight(w, 4, 32, False, method="rtn")
p = torch.ops.torchao.pack_8bit_act_xbit_weight(q, s, None, 4, 32, None, None)
torch.set_num_threads(1)
y = torch.ops.torchao.linear_8bit_act_xbit_weight(torch.randn(3, 128), p, 32, 64, 128)
e = tk.explain(p, 3, 1)
print(json.dumps({"source": e.source, "winner": e.winner, "status": tk.tuning_status()["status"]}))
"""


def test_environment_variable_and_default_path(tmp_path):
    p = _packed()
    c = _cls(p, 3, 1)
    chosen = _non_static_runnable(c)
    path = _write(tmp_path / "t.json", {c["key"]: {"winner": chosen, "times_us": {chosen: 1.0}}})
    out = json.loads(_run(PROBE, TORCHAO_KERNELS_TUNING=str(path)))
    assert out["source"] == "table" and out["winner"] == chosen
    out = json.loads(_run(PROBE, TORCHAO_KERNELS_TUNING="0"))
    assert out["source"] == "static"
    # the default path: $XDG_CACHE_HOME/torchao_kernels/tuning/<cpu>.json
    default = tk.tuning_status()["default_path"]
    name = os.path.basename(default)
    d = tmp_path / "cache" / "torchao_kernels" / "tuning"
    d.mkdir(parents=True)
    (d / name).write_text(path.read_text())
    out = json.loads(_run(PROBE, XDG_CACHE_HOME=str(tmp_path / "cache")))
    assert out["source"] == "table" and out["winner"] == chosen


FIRST_USE = """
import json, torch, torchao_kernels as tk
torch.manual_seed(0)
w = torch.randn(256, 512)
q, s, _ = tk.quantize_weight(w, 4, 32, False, method="rtn")
p = torch.ops.torchao.pack_8bit_act_xbit_weight(q, s, None, 4, 32, None, None)
torch.set_num_threads(1)
x = torch.randn(3, 512)
y = torch.ops.torchao.linear_8bit_act_xbit_weight(x, p, 32, 256, 512)
e = tk.explain(p, 3, 1)
static = e.to_dict()["clusters"][0]["static_winner"]
forced = torch.ops.torchao_kernels._linear_forced(x, p, static)
print(json.dumps({"explain": e.to_dict(), "status": tk.tuning_status()["status"],
                  "same": bool(torch.equal(y, forced))}))
"""


def test_first_use_tuning():
    out = json.loads(_run(PROBE, TORCHAO_KERNELS_TUNING="0", TORCHAO_KERNELS_TUNE="first-use"))
    assert out["source"] == "table" and "first-use tuned linear/" in out["status"]
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "TORCHAO_KERNELS_TUNE": "always"})
    assert r.returncode != 0 and "TORCHAO_KERNELS_TUNE must be 'first-use' or 'off'" in r.stderr


def test_cli_show_and_info(tmp_path):
    p = _packed()
    c = _cls(p, 1)
    path = _write(tmp_path / "t.json", {c["key"]: {"winner": c["static"], "times_us": {c["static"]: 3.0}}})
    out = _run("import sys; from torchao_kernels.__main__ import main; sys.exit(main(['tune', '--show']))",
               TORCHAO_KERNELS_TUNING=str(path))
    assert "loaded " + str(path) in out and c["key"] in out
    out = _run("import sys; from torchao_kernels.__main__ import main; sys.exit(main(['info']))",
               TORCHAO_KERNELS_TUNING=str(path))
    assert "Tuning table: loaded" in out


def test_bench_selection_reports_ratios():
    text, rows = tuning.selection_report([(64, 128)], bits=[4], ms=[1, 4], threads=[1], min_time=0.002,
                                         progress=False)
    assert len(rows) == 2 and "static policy / fastest: median" in text
    for r in rows:
        assert r["static_over_oracle"] >= 1.0 and r["oracle_us"] > 0


def test_first_use_tuning_applies_the_rule_of_tune():
    out = json.loads(_run(FIRST_USE, TORCHAO_KERNELS_TUNING="0", TORCHAO_KERNELS_TUNE="first-use"))
    c = out["explain"]["clusters"][0]
    assert c["source"] == "table" and "first-use tuned " + c["class_key"] in out["status"]
    assert out["same"]  # the first-use call's result is the static row's, bit for bit
    times = {t["kernel"]: t["us"] for t in c["table_times_us"]}
    q, s, _ = tk.quantize_weight(torch.randn(256, 512), 4, 32, False, method="rtn")
    same_class = torch.ops.torchao.pack_8bit_act_xbit_weight(q, s, None, 4, 32, None, None)
    raced = json.loads(torch.ops.torchao_kernels._linear_class_json(same_class, 3, 1))["raced"]
    assert set(times) == set(raced)  # every row raced in this m-bucket was timed (or raced out)
    assert list(times.values()) == sorted(times.values())
    static = c["static_winner"]
    confirm = {t["kernel"]: t["us"] for t in c["table_confirm_us"]}
    wins = {t["kernel"]: t["wins"] for t in c["table_confirm_us"] if "wins" in t}
    fastest = min(times, key=times.get)
    if fastest == static:
        assert not confirm and c["winner"] == static
    else:
        # the fastest row was set against the static choice round by round
        assert static in confirm and fastest in confirm and set(wins) == set(confirm) - {static}
        assert c["winner"] == tuning.confirmed_winner(times, confirm, static, wins=wins)
        if c["winner"] != static:
            assert confirm[static] >= confirm[c["winner"]] * (1 + tuning.OVERRIDE_MARGIN) * 0.9999
            assert wins[c["winner"]] >= tuning.CONFIRM_WINS


ALIASED = """
import torch, torchao_kernels as tk
torch.manual_seed(0)
q = torch.randint(-8, 8, (64, 64), dtype=torch.int8)
p = tk.pack(q, torch.rand(64, 2) * 0.1, bits=4, group_size=32)
x = torch.randn(5, 64)
x0 = x.clone()
torch.ops.torchao.linear_8bit_act_xbit_weight.out(x, p, 32, 64, 64, out=x)  # out is the activations
print(torch.equal(x, tk.linear(x0, p, 32, 64, 64)))
"""


def test_first_use_tuning_leaves_an_aliased_out_exact():
    # The tuning calls write a scratch output: an .out call whose `out` is its
    # own activations gets the same result as without tuning.
    assert _run(ALIASED, TORCHAO_KERNELS_TUNING="0", TORCHAO_KERNELS_TUNE="first-use").strip() == "True"


def test_tune_rejects_bad_arguments_before_measuring(tmp_path):
    with pytest.raises(ValueError, match="tune: path must name a file, got the directory"):
        tuning.tune(shapes=[(64, 64)], bits=4, m=1, threads=1, path=tmp_path, progress=False)
    for kw, message in ((dict(min_time=float("nan")), "min_time must be a positive number"),
                        (dict(budget=-1), "budget must be a positive number"),
                        (dict(group_size=0), "group_size must be a positive multiple of 16, got 0"),
                        (dict(shapes=[(-1, 64)]), r"shapes must be \(n, k\) pairs of positive ints")):
        with pytest.raises(ValueError, match=message):
            tuning.tune(**{"shapes": [(64, 64)], "path": tmp_path / "t.json", "progress": False, **kw})
    assert not list(tmp_path.iterdir())  # nothing written, no temporary file left


def test_override_rule_is_the_manifests():
    import tomllib
    with open(os.path.join(os.path.dirname(__file__), "..", "kernels", "manifest.toml"), "rb") as f:
        rule = tomllib.load(f)["tuning"]
    assert (tuning.CONFIRM_ROUNDS, tuning.OVERRIDE_MARGIN, tuning.CONFIRM_WINS, tuning.TUNE_CUT_FACTOR,
            tuning.TUNE_ROUND_CUT) == (rule["rounds"], rule["override_margin"], rule["override_wins"],
                                       rule["race_cut"], rule["round_cut"])


def test_override_rule_rejects_bad_arguments():
    K = torch.ops.torchao_kernels
    with pytest.raises(ValueError, match="first"):
        K._confirmed_winner("{not json", "{}", "s", 0.05, None, 0.8)
    with pytest.raises(ValueError, match="second: 'a' is not a number"):
        K._confirmed_winner("{}", '{"a": "1"}', "s", 0.05, None, 0.8)
    with pytest.raises(ValueError, match="no row was timed"):
        tuning.confirmed_winner({}, {}, "s")
    with pytest.raises(ValueError, match="samples"):
        K._paired_wins('{"a": [1]}', "s", 0.05)
    with pytest.raises(ValueError, match="'a' holds a non-number"):
        K._paired_wins('[{"a": [1, null], "s": [2, 2]}]', "s", 0.05)
    # a name repeated counts once, with its last value (as the table's parser reads it)
    assert K._confirmed_winner("{}", '{"a": 1.0, "s": 2.0, "a": 3.0}', "s", 0.05, None, 0.8) == "s"
    # no samples of the static row: nothing to pair
    assert tuning.paired_wins([{"a": [1.0, 1.0]}], "s") == {}


def test_confirmed_winner_keeps_the_static_choice_on_a_near_tie():
    first = {"a": 1.0, "b": 1.5, "static": 1.2}
    assert tuning.confirmed_winner(first, {}, "static") == "a"  # no second look: the first pass decides
    # the second look still has "a" ahead by more than the margin: it wins
    assert tuning.confirmed_winner(first, {"a": 1.0, "static": 1.1}, "static") == "a"
    # within the margin: the static choice stays (no entry a rerun would flip)
    assert tuning.confirmed_winner(first, {"a": 1.0, "static": 1.01}, "static") == "static"
    assert 1.0 * (1 + tuning.OVERRIDE_MARGIN) > 1.04  # a lead of 4% is not enough
    assert tuning.confirmed_winner(first, {"a": 1.0, "static": 1.04}, "static") == "static"
    # the second look ranks a third row first
    assert tuning.confirmed_winner(first, {"a": 1.3, "b": 1.0, "static": 1.2}, "static") == "b"


def test_confirmed_winner_needs_a_lead_that_holds_round_by_round():
    second = {"a": 1.0, "static": 1.2}  # "a" 20% ahead at the median...
    # ...and faster in 4 of 5 rounds: it wins
    assert tuning.confirmed_winner(second, second, "static", wins={"a": 0.8}) == "a"
    # ...but faster in only 3 of 5 (a few lucky rounds carried the median): the static choice stays
    assert tuning.confirmed_winner(second, second, "static", wins={"a": 0.6}) == "static"
    assert tuning.confirmed_winner(second, second, "static", wins={"a": 0.6}, min_wins=0.5) == "a"


def test_table_listing_shows_the_times_that_decided():
    entries = {"linear/k1": {"winner": "s", "static": "s", "times_us": {"a": 9.0, "s": 10.0},
                             "confirm_us": {"a": 9.9, "s": 10.1}, "confirm_wins": {"a": 0.2}},
               "linear/k2": {"winner": "a", "static": "s", "times_us": {"a": 5.0, "b": 6.0, "s": 7.0}}}
    lines = tuning.format_entries(entries, known="sab").splitlines()
    k1 = next(line for line in lines if line.startswith("linear/k1")).split()
    k2 = next(line for line in lines if line.startswith("linear/k2")).split()
    # the second look's times (its winner kept the static choice), not the first pass's 9.0
    assert k1[1:] == ["s", "10.1", "a", "9.9", "s", "10.1", "(second", "look)"]
    assert k2[1:] == ["a", "5.0", "b", "6.0", "s", "7.0"]
    # a corrupt file's fields are skipped, never raised on
    bad = {"linear/k3": {"winner": "s", "static": "s", "times_us": {"s": 2.0, "a": "x"},
                         "confirm_us": {"a": "fast", "s": -1}},
           "linear/k4": {"winner": "s", "times_us": [1, 2]}, "linear/k5": "junk"}
    bad["linear/k6"] = {"winner": "qd8_no_such_kernel__avx2", "static": "s", "times_us": {"qd8_no_such_kernel__avx2": 1.0}}
    text = tuning.format_entries(bad, known="sab")
    # selection ignores an entry naming a kernel this build lacks; the listing says so
    k6 = next(line for line in text.splitlines() if line.startswith("linear/k6"))
    assert k6.endswith("(unknown kernel: ignored)") and "1.0" not in k6
    assert next(line for line in text.splitlines() if line.startswith("linear/k3")).split()[1:3] == ["s", "2.0"]
    assert any(line.startswith("linear/k4") for line in text.splitlines())


def test_paired_samples_come_from_the_same_rounds(monkeypatch):
    # A row costlier than a round is timed once per round, one cheaper in a
    # batch; asked for paired samples, neither reuses its estimate call, so the
    # i-th sample of every row comes from round i.
    import time as _time
    calls = []

    class FakeOps:
        @staticmethod
        def _linear_forced(x, buf, name):
            calls.append(name)
            end = _time.perf_counter() + {"slow": 0.0015, "fast": 0.0002}[name]
            while _time.perf_counter() < end:
                pass

    monkeypatch.setattr(tuning, "_K", FakeOps)
    prob = tuning.Problem(8, 16, 4, torch.zeros(1, dtype=torch.uint8))
    rounds = 5
    paired: dict = {}
    tuning._time_rows(["slow", "fast"], prob, 1, 1, False, 0.005, rounds, 0, cut=0, samples_out=paired)
    assert set(paired) == {"slow", "fast"} and all(len(v) == rounds for v in paired.values())
    assert calls.count("slow") == 2 + rounds  # warm-up, estimate, then one per round
    calls.clear()
    tuning._time_rows(["slow", "fast"], prob, 1, 1, False, 0.005, rounds, 0, cut=0)
    assert calls.count("slow") == 2 + rounds - 1  # unpaired: the estimate counts as a round


def test_paired_wins_compare_rows_within_each_round():
    # Round 3 is slow for both rows (the machine, not the row): pairing within
    # rounds compares each round's times, whatever the machine did in the others.
    pts = [{"static": [1.0, 1.1, 3.0], "a": [0.9, 1.0, 2.9], "b": [1.2, 1.0, 3.5]},
           {"static": [2.0, 2.0], "a": [1.9, 2.1], "b": [1.0, 1.0]}]
    w = tuning.paired_wins(pts, "static", margin=0.0)
    assert w == {"a": 4 / 5, "b": 3 / 5}
    # a round counts only when the row leads by the margin: "a"'s 3% lead in round 3 does not
    w = tuning.paired_wins(pts, "static", margin=0.05)
    assert w == {"a": 3 / 5, "b": 3 / 5}


def test_bench_selection_times_close_calls_again():
    text, rows = tuning.selection_report([(64, 128)], bits=[4], ms=[1, 4], threads=[1], min_time=0.002,
                                         progress=False)
    for r in rows:
        assert isinstance(r["confirmed"], bool)
        if not r["confirmed"]:  # a first-pass ratio, below the margin or with one row to compare
            assert r["static_over_oracle"] <= 1 + tuning.CONFIRM_MARGIN or r["static"] == r["oracle"]
    _, plain = tuning.selection_report([(64, 128)], bits=[4], ms=[1], threads=[1], min_time=0.002,
                                       progress=False, confirm=False)
    assert not any(r["confirmed"] for r in plain)


class _FakeKernels:
    """Stands in for the op and the clock: each row's call takes a fixed time
    on a clock of its own (timings exact on any machine); counts calls."""

    def __init__(self, ms_by_row):
        self.ms, self.calls, self.now = ms_by_row, {r: 0 for r in ms_by_row}, 0.0

    def _linear_forced(self, x, packed, name):
        self.calls[name] += 1
        self.now += self.ms[name] / 1e3

    def perf_counter(self):
        return self.now


def test_tune_races_rows_and_reuses_costly_estimate_calls(monkeypatch):
    # Rows 2 ms (the first, whose warm-up call is discarded), 2.2 ms, 4 ms
    # (2x: out of the race at tune()'s 1.5x) and 14 ms (7x: dropped after its
    # first call). Every call takes more than a round (1 ms), so each row is
    # called once per round, its estimate call being the first round.
    fake = _FakeKernels({"a": 2.0, "b": 2.2, "c": 4.0, "d": 14.0})
    monkeypatch.setattr(tuning, "_K", fake)
    monkeypatch.setattr(tuning, "time", fake)
    p = tuning.Problem(8, 64, 4, torch.zeros(1, dtype=torch.int8))
    rounds = 3
    secs = tuning._time_rows(list(fake.ms), p, 1, 1, cold=False, min_time=rounds * 1e-3, rounds=rounds, l3=0,
                             cut=tuning.TUNE_CUT_FACTOR)
    assert fake.calls == {"a": 1 + rounds, "b": rounds, "c": 1, "d": 1}, fake.calls
    # Timed rows: their median; cut rows: their estimate.
    assert secs == pytest.approx({r: ms / 1e3 for r, ms in fake.ms.items()}), secs
    # Without a cut every row runs every round (bench --selection's second look).
    fake.calls = {r: 0 for r in fake.ms}
    tuning._time_rows(list(fake.ms), p, 1, 1, cold=False, min_time=rounds * 1e-3, rounds=rounds, l3=0, cut=0)
    assert fake.calls == {"a": 1 + rounds, "b": rounds, "c": rounds, "d": rounds}, fake.calls
    # Cheap calls (a round holds many): two estimate calls, then batches per round.
    fake.calls = {r: 0 for r in fake.ms}
    tuning._time_rows(["a", "b"], p, 1, 1, cold=False, min_time=rounds * 0.1, rounds=rounds, l3=0,
                      cut=tuning.TUNE_CUT_FACTOR)
    per_round = {"a": 0.1 / 2e-3, "b": 0.1 / 2.2e-3}  # calls (the batch rounds down)
    for r in ("a", "b"):
        assert 3 + rounds * (int(per_round[r]) - 1) <= fake.calls[r] <= 3 + rounds * int(per_round[r]), fake.calls


def test_tune_times_rows_far_behind_after_the_first_round_no_further(monkeypatch):
    # [tuning] round_cut: rows of 2, 2.2 and 2.8 ms (1.4x: inside the 1.5x
    # race cut, beyond the 1.2x round cut) and cheap calls (a round holds
    # many): the 2.8 ms row runs its first calls and the first round only;
    # its one round is its time.
    fake = _FakeKernels({"a": 2.0, "b": 2.2, "c": 2.8})
    monkeypatch.setattr(tuning, "_K", fake)
    monkeypatch.setattr(tuning, "time", fake)
    p = tuning.Problem(8, 64, 4, torch.zeros(1, dtype=torch.int8))
    rounds, per_round = 3, 0.1
    assert 1.1 < tuning.TUNE_ROUND_CUT < 1.4 < tuning.TUNE_CUT_FACTOR
    secs = tuning._time_rows(list(fake.ms), p, 1, 1, cold=False, min_time=rounds * per_round, rounds=rounds,
                             l3=0, cut=tuning.TUNE_CUT_FACTOR, round_cut=tuning.TUNE_ROUND_CUT)
    batch = {r: int(per_round / (ms / 1e3)) for r, ms in fake.ms.items()}
    assert fake.calls["c"] == 3 + batch["c"], fake.calls  # a warm-up, two estimate calls, one round
    for r in ("a", "b"):
        assert fake.calls[r] == 3 + rounds * batch[r], fake.calls
    assert secs == pytest.approx({r: ms / 1e3 for r, ms in fake.ms.items()}), secs
    # Without round_cut (bench --selection) every row in the race runs every round.
    fake.calls = {r: 0 for r in fake.ms}
    tuning._time_rows(list(fake.ms), p, 1, 1, cold=False, min_time=rounds * per_round, rounds=rounds, l3=0,
                      cut=tuning.TUNE_CUT_FACTOR)
    assert fake.calls["c"] == 3 + rounds * batch["c"], fake.calls


def test_tune_races_rows_within_range_factor_of_their_m_range():
    # kernels/manifest.toml [tuning] range_factor: a row meant for m =
    # [m_min, m_max] is raced only in buckets starting at most range_factor *
    # m_max and ending at least m_min / range_factor; every runnable row
    # stays runnable (bench --selection times them all).
    import tomllib
    with open(os.path.join(os.path.dirname(__file__), "..", "kernels", "manifest.toml"), "rb") as f:
        factor = tomllib.load(f)["tuning"]["range_factor"]
    m_min = {k["name"]: k["m_min"] for k in tk.info()["kernels"]}
    m_max = {k["name"]: k["m_max"] for k in tk.info()["kernels"]}
    p = _packed(256, 256)
    # tune's m -> its bucket's first and last m (None: unbounded)
    bucket_of = {1: (1, 1), 2: (2, 2), 3: (3, 3), 4: (4, 7), 8: (8, 15), 16: (16, 31), 32: (32, 63),
                 64: (64, 127), 128: (128, None)}
    out_above = out_below = False
    for m, (lo, hi) in bucket_of.items():
        c = _cls(p, m)
        want = [r for r in c["runnable"] if (m_max[r] is None or lo <= factor * m_max[r])
                and (hi is None or m_min[r] <= factor * hi)]
        assert c["raced"] == want, (m, c)
        assert c["static"] in c["raced"]
        for r in set(c["runnable"]) - set(want):
            out_above |= m_max[r] is not None and lo > factor * m_max[r]
            out_below |= hi is not None and m_min[r] > factor * hi
    runnable = _cls(p, 1)["runnable"]
    # on a CPU with GEMV rows (m up to 3), the m >= 16 classes leave them out
    if any(m_max[r] is not None and m_max[r] <= 3 for r in runnable):
        assert out_above
    # with a tile meant for m >= 8, the m = 1 class leaves it out
    if any(m_min[r] > factor for r in runnable):
        assert out_below


def test_tune_times_only_the_raced_rows(monkeypatch):
    p = _packed(256, 256)
    c = _cls(p, 128, 1)
    timed = set()
    real = tuning._time_rows

    def spy(rows, *a, **kw):
        timed.update(rows)
        return real(rows, *a, **kw)

    monkeypatch.setattr(tuning, "_time_rows", spy)
    plans = tuning.plan_classes([tuning.Problem(256, 256, 4, p)], [128], [1])
    tuning.measure_classes(plans, 0.002, progress=False, raced_only=True)
    assert timed and timed <= set(c["raced"])
    assert set(tuning._timed_rows(c["raced"])) <= timed | set(c["raced"])
    timed.clear()
    tuning.measure_classes(plans, 0.002, progress=False, cut=0)
    assert timed == set(tuning._timed_rows(c["runnable"]))


def test_cold_copies_are_made_once_per_problem(monkeypatch):
    made = []
    real = tuning._cold_copies

    def counting(packed, l3):
        made.append(packed)
        return real(packed, l3)

    monkeypatch.setattr(tuning, "_cold_copies", counting)
    a, b = torch.zeros(1 << 20, dtype=torch.int8), torch.ones(1 << 20, dtype=torch.int8)
    cache = tuning._ColdCopies()
    first = cache.get(a, 4 << 20)
    assert first[0] is a and len(first) >= 2 and all(torch.equal(t, a) for t in first)
    assert cache.get(a, 4 << 20) is first and len(made) == 1  # the same problem again: no new copies
    second = cache.get(b, 4 << 20)
    assert second[0] is b and len(made) == 2
    cache.clear()
    assert cache.get(b, 4 << 20) is not second and len(made) == 3
    # cold items grouped by problem in order of first appearance, warm ones first in their order
    items = [("c", a), ("w", a), ("c", b), ("c", a), ("w", b), ("c", b)]
    order = tuning._cold_grouped(list(range(len(items))),
                                 lambda i: items[i][1] if items[i][0] == "c" else None)
    assert order == [1, 4, 0, 3, 2, 5]


def test_second_look_only_for_a_lead_of_the_margin(monkeypatch):
    # The first pass put "fast" ahead of the static choice: by 2% in class A
    # (a near-tie: the static choice stays without a second look), by 30% in
    # class B (timed again).
    p = tuning.Problem(8, 64, 4, torch.zeros(1, dtype=torch.int8))
    a = tuning.ClassPlan("A", False, 1, ["static", "fast"], "static", [(p, 4)], raced=["static", "fast"])
    b = tuning.ClassPlan("B", False, 1, ["static", "fast"], "static", [(p, 8)], raced=["static", "fast"])
    first = {"A": {"static": 1.02, "fast": 1.0}, "B": {"static": 1.3, "fast": 1.0}}
    per_class = {k: [(p, pl.points[0][1], first[k])] for k, pl in (("A", a), ("B", b))}
    looked = []

    def fake_time_rows(rows, prob, m, threads, cold, t, rounds, l3, cut=0, samples_out=None):
        looked.append(m)
        samples_out.update({r: [first["B"][r]] * rounds for r in rows})
        return dict(first["B"])

    monkeypatch.setattr(tuning, "_time_rows", fake_time_rows)
    second = tuning._confirm_all([a, b], per_class, first, 0.01, 0)
    assert looked == [8] and set(second) == {"B"}
    assert tuning._entry(a, first["A"], per_class["A"])["winner"] == "static"
    confirmed, wins = second["B"]
    assert tuning._entry(b, first["B"], per_class["B"], confirmed, wins)["winner"] == "fast"
