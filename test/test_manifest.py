"""The kernel manifest (kernels/manifest.toml) is the one declaration of every
kernel: the derived files are current, the compiled registry is exactly the
manifest, and the checks that keep a file's ISA flags within what selection
checks actually fail when they should."""
import copy
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import torchao_kernels as tk

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import gen_kernels  # noqa: E402

MANIFEST = gen_kernels.load()
ROWS = {k["name"]: k for k in tk.info()["kernels"]}


def test_derived_files_are_current():
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_kernels.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_registry_is_the_manifest():
    declared = [k["name"] for k in MANIFEST["kernel"]]
    assert declared, "the manifest declares no kernel"
    assert list(ROWS) == declared  # same rows, same order
    for k in MANIFEST["kernel"]:
        row = ROWS[k["name"]]
        op = "embedding" if k["op"] == "embedding" else "linear"
        assert row["op"] == op
        assert row["format"] == k["format"]
        assert row["isa"] == k["isa"]
        assert (row["mr"], row["nr"]) == (k["mr"], k["nr"])
        assert row["kr"] == int(k["format"].split("k")[1])
        m_min, m_max = k.get("m", [1, 0])
        assert row["m_min"] == m_min and row["m_max"] == (m_max or None)
        assert row["priority"] == k["priority"]
        assert row["why"] == k["why"]
        assert row["lhs_panel_rows"] == k.get("lhs_panel", [0, 4])[0]
        if "lhs_panel" in k:
            assert row["lhs_panel_kr"] == k["lhs_panel"][1]
        prefs = [(p["uarch_class"], p["bonus"], p["m_min"], p["m_max"] or 0, p["bits_min"], p["bits_max"],
                  p["residency"], p["groups"], p["rows"], p["threads"]) for p in row["uarch_prefs"]]
        assert prefs == gen_kernels.uarch_prefs(k), k["name"]
        assert row["long_groups"] == (k.get("groups") != "short"), k["name"]
        feats = MANIFEST["isa"][k["isa"]]["features"]
        want = {MANIFEST["features"][f]["bit"].removeprefix("kIsa").lower() for f in feats}
        assert {f.replace(".", "") for f in row["required_isa"]} == want, k["name"]


def _check_error(m):
    with pytest.raises(gen_kernels.ManifestError) as e:
        gen_kernels.check(m)
    return str(e.value)


def test_check_rejects_a_file_flag_its_rows_do_not_require():
    m = copy.deepcopy(MANIFEST)
    src = "kernels/x86/avx2/qd8_f32_qbw_gemm_avx2.cpp"
    m["sources"][src]["features"].append("avx512dq")
    msg = _check_error(m)
    assert src in msg and "avx512dq" in msg and "qd8_f32_qbwn16k4_gemv_1x32__avx2" in msg


def test_check_rejects_an_isa_feature_selection_cannot_check():
    m = copy.deepcopy(MANIFEST)
    m["isa"]["avx2"]["features"].append("avx512cd")  # no descriptor bit
    assert "avx512cd" in _check_error(m)


def test_check_rejects_format_limits_the_layout_cannot_honour():
    for key, value, needle in (("group_multiple", 32, "group_multiple 16"), ("max_bits", 4, "max_bits must be 8"),
                               ("max_group_size", 1 << 17, "< 2^31"), ("max_group_size", 40, "multiple of"),
                               ("max_dim", 1 << 31, "int32"), ("max_dim", 0, "integer >= 1"),
                               ("max_group_size_why", "", "non-empty string")):
        m = copy.deepcopy(MANIFEST)
        m["format"][key] = value
        msg = _check_error(m)
        assert "[format]" in msg and needle in msg, (key, value, msg)
    m = copy.deepcopy(MANIFEST)
    m["kernel"][2]["bits"] = [4, 9]
    assert "must list distinct widths in 1..8 ([format])" in _check_error(m)


def test_check_rejects_a_malformed_tuning_rule():
    for key, value, needle in (("race_cut", 1, "race_cut must be a number > 1"),
                               ("round_cut", 1, "round_cut must be a number > 1 and at most race_cut"),
                               ("round_cut", 2.0, "round_cut must be a number > 1 and at most race_cut"),
                               ("round_cut", True, "round_cut must be a number > 1 and at most race_cut"),
                               ("rounds", 0, "rounds must be an integer >= 1"),
                               ("override_margin", -0.1, "override_margin must be a number >= 0"),
                               ("override_wins", 1.5, "override_wins must be a share"),
                               ("range_factor", 0, "range_factor must be an integer >= 1"),
                               ("range_factor", 2.5, "range_factor must be an integer >= 1"),
                               ("range_factor", True, "range_factor must be an integer >= 1")):
        m = copy.deepcopy(MANIFEST)
        m["tuning"][key] = value
        msg = _check_error(m)
        assert "[tuning]" in msg and needle in msg, (key, value, msg)
    m = copy.deepcopy(MANIFEST)
    del m["tuning"]["range_factor"]
    assert "range_factor" in _check_error(m)
    m = copy.deepcopy(MANIFEST)
    del m["tuning"]["round_cut"]
    assert "round_cut" in _check_error(m)


def test_check_rejects_duplicates_unknown_fields_and_missing_functions():
    m = copy.deepcopy(MANIFEST)
    m["kernel"].append(copy.deepcopy(m["kernel"][2]))
    assert "declared twice" in _check_error(m)
    m = copy.deepcopy(MANIFEST)
    m["kernel"][2]["fn"] = "no_such_kernel_function"
    assert "does not define no_such_kernel_function()" in _check_error(m)
    m = copy.deepcopy(MANIFEST)
    m["kernel"][2]["isa"] = "avx9"
    assert "unknown isa 'avx9'" in _check_error(m)
    m = copy.deepcopy(MANIFEST)
    m["kernel"][2]["variant"] = "fast"
    assert "variant 'fast'" in _check_error(m)
    m = copy.deepcopy(MANIFEST)
    m["kernel"][2]["ceilng"] = "avx2_madd16"  # a misspelt field is not ignored
    assert "unknown field(s) ceilng" in _check_error(m)
    m = copy.deepcopy(MANIFEST)
    m["kernel"][2]["bits"] = [8, 8]  # a list of widths, not a range
    assert "bits [8, 8] must list distinct widths" in _check_error(m)
    m = copy.deepcopy(MANIFEST)
    m["kernel"][2]["ceiling"] = "avx2_nope"
    assert "ceiling 'avx2_nope' is no [[probe]]" in _check_error(m)
    m["kernel"][2]["ceiling"] = "avxvnni"
    assert "ceiling 'avxvnni' probes isa 'avxvnni'" in _check_error(m)
    m = copy.deepcopy(MANIFEST)
    m["kernel"][2]["lhs_panel_int16"] = True
    m["kernel"][2]["lhs_panel"] = [4, 8]
    assert "lhs_panel_int16 needs lhs_panel = [rows, 4]" in _check_error(m)


def test_check_rejects_malformed_core_class_bonuses():
    m = copy.deepcopy(MANIFEST)
    m["kernel"][2]["uarch"] = {"zen": {"bonus": 5, "m": [4, 2]}}
    assert "m range [4, 2] is empty" in _check_error(m)
    m["kernel"][2]["uarch"] = {"zen": {"bonsu": 5}}
    assert "expected a bonus" in _check_error(m)
    m["kernel"][2]["uarch"] = {"zen": [3, {"bonus": -2, "m": [2, 3]}]}
    gen_kernels.check(m)  # a list: a bonus for every m plus one for m = 2-3
    assert gen_kernels.uarch_prefs(m["kernel"][2]) == [("zen", 3, 1, 0, 1, 8, None, None, None, None),
                                                         ("zen", -2, 2, 3, 1, 8, None, None, None, None)]
    m["kernel"][2]["uarch"] = {"zen": {"bonus": 5, "bits": [3, 2]}}
    assert "bits range [3, 2]" in _check_error(m)
    m["kernel"][2]["uarch"] = {"zen": {"bonus": 5, "bits": [0, 2]}}
    assert "bits range [0, 2]" in _check_error(m)
    m["kernel"][2]["uarch"] = {"zen": {"bonus": 5, "m": [2, 3], "bits": [1, 2]}}
    gen_kernels.check(m)
    assert gen_kernels.uarch_prefs(m["kernel"][2]) == [("zen", 5, 2, 3, 1, 2, None, None, None, None)]
    assert gen_kernels.uarch_pref_text(*gen_kernels.uarch_prefs(m["kernel"][2])[0]) == \
        "+5 on zen cores at m 2..3 for 1..2-bit weights"
    m["kernel"][2]["uarch"] = {"zen": {"bonus": 5, "residency": "ram"}}
    assert "unknown residency 'ram'" in _check_error(m)
    m["kernel"][2]["uarch"] = {"zen": {"bonus": 5, "m": [8, 31], "bits": [8, 8], "residency": "dram"}}
    gen_kernels.check(m)
    assert gen_kernels.uarch_prefs(m["kernel"][2]) == [("zen", 5, 8, 31, 8, 8, "dram", None, None, None)]
    assert gen_kernels.uarch_pref_text(*gen_kernels.uarch_prefs(m["kernel"][2])[0]) == \
        "+5 on zen cores at m 8..31 for 8-bit weights with the weights in DRAM"
    m["kernel"][2]["uarch"] = {"zen": {"bonus": 5, "groups": "per-channel"}}
    assert "unknown group length 'per-channel'" in _check_error(m)
    m["kernel"][2]["uarch"] = {"zen": {"bonus": 2, "m": [8, 31], "bits": [1, 4], "groups": "long"}}
    gen_kernels.check(m)
    assert gen_kernels.uarch_prefs(m["kernel"][2]) == [("zen", 2, 8, 31, 1, 4, None, "long", None, None)]
    assert gen_kernels.uarch_pref_text(*gen_kernels.uarch_prefs(m["kernel"][2])[0]) == \
        "+2 on zen cores at m 8..31 for 1..4-bit weights with long groups"
    m["kernel"][2]["uarch"] = {"zen": {"bonus": 5, "rows": "tiny"}}
    assert "unknown row length 'tiny'" in _check_error(m)
    m["kernel"][2]["uarch"] = {"zen": {"bonus": 4, "m": [2, 2], "bits": [4, 8], "rows": "short"}}
    gen_kernels.check(m)
    assert gen_kernels.uarch_prefs(m["kernel"][2]) == [("zen", 4, 2, 2, 4, 8, None, None, "short", None)]
    assert gen_kernels.uarch_pref_text(*gen_kernels.uarch_prefs(m["kernel"][2])[0]) == \
        "+4 on zen cores at m 2..2 for 4..8-bit weights over short rows"
    m["kernel"][2]["uarch"] = {"zen": {"bonus": 5, "threads": "6"}}
    assert "unknown thread bucket '6'" in _check_error(m)
    m["kernel"][2]["uarch"] = {"zen": {"bonus": 20, "m": [1, 2], "bits": [4, 4], "residency": "llc", "threads": "2"}}
    gen_kernels.check(m)
    assert gen_kernels.uarch_prefs(m["kernel"][2]) == [("zen", 20, 1, 2, 4, 4, "llc", None, None, "2")]
    assert gen_kernels.uarch_pref_text(*gen_kernels.uarch_prefs(m["kernel"][2])[0]) == \
        "+20 on zen cores at m 1..2 for 4-bit weights with the weights in LLC on 2 threads"


def test_names_are_derived_from_fields():
    k = {"op": "gemm", "format": "n16k4", "mr": 8, "nr": 4, "lhs_panel": [8, 8], "isa": "i8mm"}
    assert gen_kernels.kernel_name(k) == "qd8p8x8_f32_qbwn16k4_gemm_8x4__i8mm"
    k = {"op": "gemv", "format": "n16k4", "mr": 1, "nr": 32, "variant": "prefetch", "isa": "avx2"}
    assert gen_kernels.kernel_name(k) == "qd8_f32_qbwn16k4_gemv_1x32_prefetch__avx2"
    k = {"op": "embedding", "format": "n1k4", "mr": 1, "nr": 1, "isa": "neon"}
    assert gen_kernels.kernel_name(k) == "qbwn1k4_f32_embedding_1x1__neon"


def _compile(cxx, flags, tmp_path):
    src = tmp_path / "probe.cpp"
    src.write_text("int probe() { return 1; }\n")
    guard = ROOT / "kernels" / "generated" / "isa_guard.h"
    return subprocess.run([cxx, "-c", "-o", str(tmp_path / "probe.o"), "-include", str(guard), *flags,
                           str(src)], capture_output=True, text=True)


def _allow(features):
    return [f"-DTK_ALLOW_{f.upper()}" for f in features]


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 compiler flags")
def test_isa_guard_stops_a_build_with_flags_beyond_the_rows(tmp_path):
    cxx = shutil.which("g++") or shutil.which("c++")
    assert cxx, "no C++ compiler"
    feats = MANIFEST["sources"]["kernels/x86/avx512vnni/qd8_f32_qbw_gemm_ymm_avx512vnni.cpp"]["features"]
    flags = gen_kernels.source_flags(MANIFEST, "kernels/x86/avx512vnni/qd8_f32_qbw_gemm_ymm_avx512vnni.cpp")
    ok = _compile(cxx, flags + _allow(feats), tmp_path)
    assert ok.returncode == 0, ok.stderr
    # The same file compiled with DQ, which its entry does not allow.
    bad = _compile(cxx, flags + ["-mavx512dq"] + _allow(feats), tmp_path)
    assert bad.returncode != 0 and "avx512dq" in bad.stderr
    # Generic code compiled for AVX2 (e.g. a global -march=native).
    generic = _compile(cxx, ["-mavx2"], tmp_path)
    assert generic.returncode != 0 and "avx2" in generic.stderr
    assert _compile(cxx, [], tmp_path).returncode == 0


def test_isa_guard_stops_an_arm_march_wider_than_the_rows(tmp_path):
    cxx = shutil.which("aarch64-linux-gnu-g++") or (shutil.which("g++") if platform.machine() == "aarch64" else None)
    if cxx is None:
        pytest.skip("no aarch64 compiler (apt install g++-aarch64-linux-gnu)")
    src = "kernels/aarch64/i8mm/qd8_f32_qbw_gemm_i8mm.cpp"
    feats = MANIFEST["sources"][src]["features"]
    flags = gen_kernels.source_flags(MANIFEST, src)
    assert flags == ["-march=armv8.2-a+dotprod+i8mm"]
    ok = _compile(cxx, flags + _allow(feats), tmp_path)
    assert ok.returncode == 0, ok.stderr
    # armv8.6-a brings v8.3-v8.6 features (complex numbers, bf16, ...) that
    # selection never checks: a v8.4 core with i8mm would be at risk.
    bad = _compile(cxx, ["-march=armv8.6-a+i8mm"] + _allow(feats), tmp_path)
    assert bad.returncode != 0 and "which no row of this file requires" in bad.stderr


def test_the_format_limits_are_the_manifests_everywhere():
    """[format] is stated once: the Python module and the C++ header are derived
    from it (the --check test above keeps them current), and the ops, the
    Python API and the command lines all refuse the first value past each limit
    with the manifest's number in the message."""
    import argparse

    import torch

    import torchao_kernels as tk
    from torchao_kernels import _format_limits as L
    from torchao_kernels import cli_types

    f = gen_kernels.load()["format"]
    assert (L.MAX_BITS, L.MAX_DIM, L.GROUP_MULTIPLE, L.MAX_GROUP_SIZE) == (
        f["max_bits"], f["max_dim"], f["group_multiple"], f["max_group_size"])
    assert cli_types.MAX_GROUP_SIZE == L.MAX_GROUP_SIZE and list(cli_types.BITS)[-1] == L.MAX_BITS
    q = torch.zeros(16, 64, dtype=torch.int8)
    s = torch.ones(16, 2)
    bad_bits = L.MAX_BITS + 1
    with pytest.raises(ValueError, match=rf"weight_nbit must be in 1\.\.{L.MAX_BITS}, got {bad_bits}"):
        torch.ops.torchao.pack_8bit_act_xbit_weight(q, s, None, bad_bits, 32, None, None)
    with pytest.raises(ValueError, match=rf"weight_nbit must be in 1\.\.{L.MAX_BITS}, got {bad_bits}"):
        torch.ops.torchao.pack_embedding_xbit(q, bad_bits)
    with pytest.raises(ValueError, match=rf"bits must be an int in 1\.\.{L.MAX_BITS}, got {bad_bits}"):
        tk.quantize_weight(torch.randn(16, 64), bits=bad_bits)
    with pytest.raises(ValueError, match=rf"bits must be an int in 1\.\.{L.MAX_BITS}"):
        tk.QuantConfig(bits=bad_bits)
    odd = L.GROUP_MULTIPLE + L.GROUP_MULTIPLE // 2
    with pytest.raises(ValueError, match=rf"group_size must be a positive multiple of {L.GROUP_MULTIPLE}, got {odd}"):
        torch.ops.torchao.pack_8bit_act_xbit_weight(torch.zeros(16, 3 * odd, dtype=torch.int8), torch.ones(16, 3),
                                                    None, 4, odd, None, None)
    with pytest.raises(ValueError, match=rf"group_size must be a multiple of {L.GROUP_MULTIPLE}"):
        tk.quantize_weight(torch.randn(16, 3 * odd), bits=4, group_size=odd)
    with pytest.raises(ValueError, match=rf"group_size must be a multiple of {L.GROUP_MULTIPLE}"):
        tk.QuantConfig(group_size=odd)
    why = rf"at most {L.MAX_GROUP_SIZE} \({L.MAX_GROUP_SIZE_WHY}\), got"
    big = torch.zeros(16, 2 * (L.MAX_GROUP_SIZE + L.GROUP_MULTIPLE), dtype=torch.int8)
    with pytest.raises(ValueError, match="group_size must be " + why):
        torch.ops.torchao.pack_8bit_act_xbit_weight(big, torch.ones(16, 2), None, 4, L.MAX_GROUP_SIZE + L.GROUP_MULTIPLE,
                                                    None, None)
    with pytest.raises(ValueError, match="group_size must be " + why):
        tk.QuantConfig(group_size=L.MAX_GROUP_SIZE + L.GROUP_MULTIPLE)
    tk.QuantConfig(group_size=L.MAX_GROUP_SIZE)
    with pytest.raises(argparse.ArgumentTypeError, match="group size must be " + why):
        cli_types.group_size()(str(L.MAX_GROUP_SIZE + L.GROUP_MULTIPLE))
    with pytest.raises(argparse.ArgumentTypeError, match=rf"multiple of {L.GROUP_MULTIPLE}"):
        cli_types.group_size()(str(odd))
