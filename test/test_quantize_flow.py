"""quantize_ as a whole: all or nothing, layer names, overrides that cannot
apply, filter_fn, embeddings under GPTQ, QuantConfig changed after
construction, and torchao's flow given a calibration it cannot match."""
import copy
import logging
import warnings

import pytest
import torch
from torch import nn

import torchao_kernels as tk
from torchao_kernels import QuantizedLinear
from torchao_kernels.embedding import QuantizedEmbedding


def test_an_error_in_a_later_layer_puts_every_layer_back():
    torch.manual_seed(0)
    calib_model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64))
    calib = tk.calibrate(calib_model, [torch.randn(4, 64)])
    m = nn.Sequential(nn.Linear(64, 64), nn.Linear(128, 64))   # layer 1 does not fit the calibration
    before = [id(c) for c in m]
    with pytest.raises(ValueError, match="was the calibration recorded on another model"):
        tk.quantize_(m, bits=4, calibration=calib, progress=False)
    assert [id(c) for c in m] == before and all(type(c) is nn.Linear for c in m)
    # a non-finite weight in a later layer: the same
    m = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64))
    with torch.no_grad():
        m[1].weight[3, 5] = float("nan")
    with pytest.raises(ValueError, match="w must be finite"):
        tk.quantize_(m, bits=4, progress=False)
    assert type(m[0]) is nn.Linear


def test_empty_layers_are_skipped_with_the_reason():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: zero-element init
        m = nn.Sequential(nn.Linear(64, 64), nn.Linear(0, 16), nn.Linear(64, 0), nn.Embedding(4, 0),
                          nn.Embedding(0, 32))
    for group_size in (32, None):  # per channel: a group of embedding_dim = 0 values used to divide by zero
        report = tk.quantize_(m, bits=4, group_size=group_size, progress=False)
        assert [f for f, _ in report["quantized"]] == ["0"]
        assert [f for f, r in report["skipped"] if "empty layer" in r] == ["1", "2"]
        assert [f for f, r in report["skipped"] if "empty table" in r] == ["3", "4"]
        m[0] = nn.Linear(64, 64)


def test_an_override_names_a_shared_layer_by_any_of_its_names():
    m = nn.Module()
    m.a = nn.Linear(64, 64)
    m.b = m.a
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "matches no layer" warning either
        tk.quantize_(m, bits=4, overrides={"b": 8}, progress=False)
    assert m.a is m.b and tk.packed_info(m.a.packed_weights)["bits"] == 8
    # first rule in order that matches any of its names
    m = nn.Module()
    m.a = nn.Linear(64, 64)
    m.b = m.a
    tk.quantize_(m, bits=4, overrides={"b": 8, "a": 2}, progress=False)
    assert tk.packed_info(m.a.packed_weights)["bits"] == 8


def test_filter_fn_sees_the_linears_only():
    # as torchao's: a filter written for nn.Linear (reading out_features) keeps working;
    # embeddings are chosen by embeddings= and overrides
    m = nn.Sequential(nn.Embedding(100, 64), nn.Linear(64, 64), nn.Linear(64, 32))
    seen = []
    report = tk.quantize_(m, bits=4, filter_fn=lambda mod, fqn: seen.append(fqn) or mod.out_features >= 64,
                          progress=False)
    assert seen == ["1", "2"]
    assert sorted(f for f, _ in report["quantized"]) == ["0", "1"] and type(m[2]) is nn.Linear
    m = nn.Sequential(nn.Embedding(100, 64), nn.Linear(64, 64))
    tk.quantize_(m, bits=4, overrides={"0": None}, progress=False)
    assert type(m[0]) is nn.Embedding and isinstance(m[1], QuantizedLinear)


def test_gptq_quantizes_untied_embeddings_with_the_search():
    torch.manual_seed(0)
    m = nn.Module()
    m.emb, m.fc = nn.Embedding(100, 64), nn.Linear(64, 64)
    m.forward = lambda i: m.fc(m.emb(i))
    calib = tk.calibrate(m, [torch.randint(0, 100, (2, 16))])
    table = m.emb.weight.detach().clone()
    report = tk.quantize_(m, bits=4, method="gptq", calibration=calib, progress=False)
    assert sorted(f for f, _ in report["quantized"]) == ["emb", "fc"]
    q, s, z = tk.quantize_weight(table, 4, 32, False, method="search")
    assert isinstance(m.emb, QuantizedEmbedding)
    assert torch.equal(m.emb(torch.arange(100)), tk.dequantize_weight(q, s, z, 32))


def test_an_override_on_a_tied_embedding_warns_that_the_heads_settings_apply():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.lm_head = nn.Embedding(100, 64), nn.Linear(64, 100, bias=False)
            self.lm_head.weight = self.embed.weight

    m = Tied()
    with pytest.warns(UserWarning, match=r"overrides\['embed'\] names 'embed', which is tied to 'lm_head'"):
        tk.quantize_(m, bits=4, overrides={"embed": 8}, progress=False)
    assert m.embed.is_tied and m.embed.bits == 4
    m = Tied()
    with pytest.warns(UserWarning, match="the head's settings apply"):
        tk.quantize_(m, bits=4, overrides={"embed": {"scale_dtype": torch.bfloat16}}, progress=False)
    m = Tied()
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # the same settings as the head: nothing to say
        tk.quantize_(m, bits=4, overrides={"embed": {"has_zeros": False}}, progress=False)


def test_a_quantconfig_as_an_override_gives_only_layer_settings():
    with pytest.raises(ValueError, match=r"overrides\['\*'\]: .* its lm_head, overrides would be ignored"):
        tk.QuantConfig(bits=4, overrides={"*": tk.QuantConfig(bits=6, lm_head=False, overrides={"fc": 2})})
    tk.QuantConfig(bits=4, overrides={"*": tk.QuantConfig(bits=6, overrides={})})  # empty: none
    cfg = tk.QuantConfig(bits=4, overrides={"*": tk.QuantConfig(bits=6, has_zeros=True)})
    m = nn.Sequential(nn.Linear(64, 64))
    tk.quantize_(m, cfg, progress=False)
    info = tk.packed_info(m[0].packed_weights)
    assert info["bits"] == 6 and info["has_zeros"]


def test_a_quantconfig_changed_after_construction_is_checked_and_applied():
    cfg = tk.QuantConfig(bits=4)
    cfg.overrides = {"0": 8}
    m = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64))
    tk.quantize_(m, cfg, progress=False)
    assert [tk.packed_info(x.packed_weights)["bits"] for x in m] == [8, 4]
    with pytest.raises(ValueError, match="method='gptq' needs calibration"):
        cfg.method = "gptq"
    assert cfg.method == "search"   # the refused value is not kept
    with pytest.raises(ValueError, match="bits must be an int in 1..8"):
        cfg.bits = 9
    assert cfg.bits == 4 and cfg.describe().startswith("4-bit")


def test_torchao_flow_says_when_the_calibration_matches_no_layer(caplog):
    pytest.importorskip("torchao")
    from torchao.quantization import quantize_ as torchao_quantize_

    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))
    calib = tk.calibrate(m, [torch.randn(64, 64)])
    copy_ = copy.deepcopy(m)
    with caplog.at_level(logging.WARNING, logger="torchao_kernels"):
        torchao_quantize_(copy_, tk.QuantConfig(bits=3, method="gptq", calibration=calib))
    warned = [r for r in caplog.records if "has no statistics for a Linear(64, 64)" in r.getMessage()]
    assert len(warned) == 1   # once per config, not per layer
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="torchao_kernels"):
        torchao_quantize_(m, tk.QuantConfig(bits=3, method="gptq", calibration=calib))
    assert not [r for r in caplog.records if "has no statistics" in r.getMessage()]


def test_the_report_says_when_gptq_fell_back_to_the_search():
    torch.manual_seed(0)
    m = nn.Module()
    m.a, m.unused = nn.Linear(64, 64), nn.Linear(64, 64)
    m.forward = lambda x: m.a(x)
    calib = tk.calibrate(m, [torch.randn(8, 64)])
    desc = dict(tk.quantize_(m, bits=4, method="gptq", calibration=calib, progress=False)["quantized"])
    assert "not 'gptq'" in desc["unused"] and "not 'gptq'" not in desc["a"]


def test_an_override_for_an_embedding_warns_when_embeddings_are_off():
    m = nn.Module()
    m.emb, m.fc = nn.Embedding(100, 64), nn.Linear(64, 64)
    with pytest.warns(UserWarning, match=r"overrides\['emb'\] matches no nn.Linear \(embeddings=False\)"):
        tk.quantize_(m, bits=4, embeddings=False, overrides={"emb": 8}, progress=False)


def test_quantize_under_inference_mode_with_several_threads():
    # the search spreads rows over worker threads; they take the caller's inference mode
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with torch.inference_mode():
            m = nn.Sequential(nn.Linear(256, 512))
            tk.quantize_(m, bits=4, group_size=32, progress=False)
            assert isinstance(m[0], QuantizedLinear) and m(torch.randn(2, 256)).shape == (2, 512)
    finally:
        torch.set_num_threads(old)


def test_warnings_point_at_the_callers_line():
    m = nn.Sequential(nn.Linear(64, 64))
    tk.quantize_(m, bits=4, progress=False)
    with pytest.warns(UserWarning, match="already quantized") as rec:
        tk.quantize_(m, bits=4, progress=False)
    assert rec[0].filename == __file__
    with pytest.warns(UserWarning, match="matches no nn.Linear") as rec:
        tk.quantize_(nn.Sequential(nn.Linear(64, 64)), bits=4, overrides={"nope": 8}, progress=False)
    assert rec[0].filename == __file__


def test_a_group_above_the_kernels_limit_is_skipped_with_the_reason():
    # A per-channel group of 32784 values (a multiple of 16, above the format's
    # 32768) used to reach the pack op, whose error failed the whole quantize_.
    from torchao_kernels._format_limits import MAX_GROUP_SIZE
    k = MAX_GROUP_SIZE + 16
    m = nn.Sequential(nn.Linear(64, 32), nn.Linear(k, 2), nn.Embedding(4, k))
    report = tk.quantize_(m, bits=4, group_size=None, progress=False)
    assert [f for f, _ in report["quantized"]] == ["0"]
    reasons = dict(report["skipped"])
    assert reasons["1"] == (f"group_size={k} (per channel, = in_features) is above {MAX_GROUP_SIZE} "
                            "(int32 group sums stay exact up to it)")
    assert reasons["2"].startswith(f"group_size={k} (per channel, = embedding_dim) is above {MAX_GROUP_SIZE}")
    assert type(m[1]) is nn.Linear and type(m[2]) is nn.Embedding
