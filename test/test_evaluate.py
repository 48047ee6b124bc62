"""The eval's bookkeeping: the paired per-token comparison with round to
nearest, and how the "no configuration worse than round to nearest" target
reads it."""
import math

import torch

from torchao_kernels import evaluate

F32 = torch.float32


def _row(config, bits, zeros, method, ppl, kl=0.1):
    return {"config": config, "bits": bits, "group": 32, "zeros": zeros, "method": method, "head_bits": None,
            "scales": "float32", "perplexity": ppl, "kl": kl, "quantized": 1, "linears": 1}


def _lm(rows):
    base = [{"config": "fp32", "bits": None, "perplexity": 10.0, "kl": 0.0, "quantized": 0, "linears": 1},
            {"config": "int8 act only", "bits": None, "perplexity": 10.1, "kl": 0.01, "quantized": 0,
             "linears": 1}]
    return {"model": "M", "key": "smollm2", "rows": base + rows, "prefill_tokens": 8}


def test_paired_difference_and_standard_error():
    cfg_r = (4, 32, True, F32, "rtn", None)
    cfg_s = (4, 32, True, F32, "search", None)
    rows = [{}, {}]
    nll_r = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    nll_s = nll_r + torch.tensor([0.1, -0.1, 0.3, -0.1], dtype=torch.float64)
    evaluate._paired_with_rtn(rows, [cfg_r, cfg_s], {cfg_r: nll_r, cfg_s: nll_s})
    d = nll_s - nll_r
    assert "nll_vs_rtn" not in rows[0]                      # rtn itself
    assert math.isclose(rows[1]["nll_vs_rtn"], float(d.mean()))
    assert math.isclose(rows[1]["nll_vs_rtn_se"], float(d.std()) / 2.0)


def _worse_target(rows):
    out = [t for t in evaluate.targets({"smollm2": _lm(rows)}) if "no configuration worse" in t["target"]]
    assert len(out) == 1
    return out[0]


def test_worse_beyond_noise_fails_the_target():
    s = _row("4-bit g32 zeros search", 4, True, "search", 10.5)
    s.update(nll_vs_rtn=0.05, nll_vs_rtn_se=0.01)           # 5 standard errors worse
    t = _worse_target([_row("4-bit g32 zeros rtn", 4, True, "rtn", 10.4), s])
    assert not t["met"] and "worse: 4-bit g32 zeros search" in t["value"]


def test_worse_within_noise_is_listed_not_failed():
    s = _row("4-bit g32 zeros search", 4, True, "search", 10.45, kl=0.09)
    s.update(nll_vs_rtn=0.005, nll_vs_rtn_se=0.004)         # 1.25 standard errors
    t = _worse_target([_row("4-bit g32 zeros rtn", 4, True, "rtn", 10.4), s])
    assert t["met"] and "none worse" in t["value"]
    assert "by less than 2 standard errors" in t["value"] and "4-bit g32 zeros search" in t["value"]


def test_better_is_not_listed_and_missing_statistics_count_as_worse():
    good = _row("4-bit g32 sym search", 4, False, "search", 10.2)
    bad = _row("4-bit g32 zeros search", 4, True, "search", 10.5)   # no paired statistics: plain comparison
    t = _worse_target([_row("4-bit g32 sym rtn", 4, False, "rtn", 10.3), good,
                       _row("4-bit g32 zeros rtn", 4, True, "rtn", 10.4), bad])
    assert not t["met"] and "sym search" not in t["value"] and "zeros search" in t["value"]


def _minilm(rows):
    base = [{"config": "fp32", "bits": None, "cos_mean": 1.0}, {"config": "int8 act only", "bits": None, "cos_mean": 0.999}]
    return {"model": "E", "key": "minilm", "rows": base + rows}


def _cos_row(config, zeros, method, cos):
    return {"config": config, "bits": 8, "group": 32, "zeros": zeros, "method": method, "scales": "float32",
            "cos_mean": cos}


def test_minilm_lower_cosine_counts_as_worse_only_beyond_its_paired_noise():
    cfg_r = (8, 32, True, F32, "rtn", None)
    cfg_s = (8, 32, True, F32, "search", None)
    cos_r = torch.tensor([0.9990, 0.9992, 0.9994, 0.9990])
    rtn, search = _cos_row("8-bit g32 zeros rtn", True, "rtn", 0.99915), _cos_row("8-bit g32 zeros search", True,
                                                                                  "search", 0.99913)
    for shift, met in (([-2e-5, 1e-5, -1e-5, 1e-5], True), ([-2e-3, -2.1e-3, -1.9e-3, -2e-3], False)):
        evaluate._paired_with_rtn([rtn, search], [cfg_r, cfg_s],
                                  {cfg_r: cos_r, cfg_s: cos_r + torch.tensor(shift)}, "cos_vs_rtn")
        assert "cos_vs_rtn" not in rtn and (search["cos_vs_rtn"] < 0) == (sum(shift) < 0)
        t = [t for t in evaluate.targets({"minilm": _minilm([rtn, search])}) if "no configuration worse" in t["target"]]
        assert len(t) == 1 and t[0]["met"] == met, t
        assert "8-bit g32 zeros search" in t[0]["value"]
        assert ("by less than 2 standard errors" in t[0]["value"]) == met
