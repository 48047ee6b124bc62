"""The demo, eval and tune command lines reject bad numbers as argparse usage
errors (exit 2, naming the option and the value) before any model loads or
any measuring starts: they used to crash minutes in (a 0 decode length
divided by zero), write NaN reports, or end in a library traceback."""
import pytest

from torchao_kernels import __main__ as cli
from torchao_kernels import demo, evaluate, tuning

from usage_errors import usage_error


@pytest.fixture
def no_work(monkeypatch):
    """Fails the test if a command gets past its arguments to the models or the measuring."""
    def fail(*a, **k):
        pytest.fail("the command went past argument checking")
    for mod, name in ((demo, "demo_smollm2"), (demo, "demo_minilm"), (evaluate, "run_lm"),
                      (evaluate, "run_minilm"), (tuning, "tune")):
        monkeypatch.setattr(mod, name, fail)


# ---------------------------------------------------------------------------
# demo

@pytest.mark.parametrize("argv, message", [
    (["--decode-tokens", "0"], "argument --decode-tokens: expected an integer > 0, got '0'"),
    (["--decode-tokens", "-2"], "argument --decode-tokens: expected an integer > 0, got '-2'"),
    (["--max-tokens", "0"], "argument --max-tokens: expected an integer > 0, got '0'"),
    (["--threads", "0"], "argument --threads: expected an integer > 0, got '0'"),
    (["--group-size", "17"], "argument --group-size: group size must be a positive multiple of 16 or -1 "
                             "(per channel), got 17"),
    (["--group-size", "-16"], "argument --group-size: group size must be a positive multiple of 16"),
    (["--group-size", "g32"], "argument --group-size: group size must be an integer or -1 (per channel), "
                              "got 'g32'"),
    (["--bits", "9"], "argument --bits: bits must be in 1..8, got '9'"),
    (["--head-bits", "0"], "argument --head-bits: bits must be in 1..8, got '0'"),
])
def test_demo_rejects_bad_numbers(argv, message, capsys):
    usage_error(demo.parse_args, argv, capsys, message)


def test_demo_run_stops_before_the_models(capsys, no_work):
    usage_error(demo.run, ["--model", "smollm2", "--decode-tokens", "0"], capsys, "--decode-tokens", "'0'")
    usage_error(cli.main, ["demo", "--max-tokens", "0"], capsys, "--max-tokens", "'0'")


def test_demo_accepts_valid_numbers():
    args = demo.parse_args([])
    assert (args.bits, args.group_size, args.threads, args.max_tokens, args.decode_tokens) == (4, 32, 1, 48, 32)
    args = demo.parse_args(["--decode-tokens", "1", "--max-tokens", "1", "--threads", "2", "--group-size", "64"])
    assert (args.decode_tokens, args.max_tokens, args.threads, args.group_size) == (1, 1, 2, 64)
    assert demo.parse_args(["--group-size", "-1"]).group_size == -1   # per channel
    assert demo.parse_args(["--group-size", "0"]).group_size == 0     # also per channel in _quantize


# ---------------------------------------------------------------------------
# eval

@pytest.mark.parametrize("argv, message", [
    (["--decode-tokens", "0"], "argument --decode-tokens: expected an integer > 0, got '0'"),
    (["--decode-tokens", "-3"], "argument --decode-tokens: expected an integer > 0, got '-3'"),
    (["--repeats", "0"], "argument --repeats: expected an integer > 0, got '0'"),
    (["--repeats", "-5"], "argument --repeats: expected an integer > 0, got '-5'"),
    (["--threads", "0"], "argument --threads: expected an integer > 0, got '0'"),
    (["--sentences", "0"], "argument --sentences: expected an integer > 0, got '0'"),
    (["--bits", ","], "argument --bits: expected at least one integer, got ','"),
    (["--bits", "0"], "argument --bits: bit widths must be in 1..8, got '0'"),
    (["--bits", "9"], "argument --bits: bit widths must be in 1..8, got '9'"),
    (["--bits", "4,9"], "argument --bits: bit widths must be in 1..8, got '4,9'"),
    (["--bits", "four"], "argument --bits: expected comma-separated integers, got 'four'"),
    (["--group-sizes", "17"], "argument --group-sizes: group size must be a positive multiple of 16 or -1 "
                              "(per channel), got 17"),
    (["--group-sizes", "32,0"], "argument --group-sizes: group size must be a positive multiple of 16 or -1 "
                                "(per channel), got 0"),
    (["--group-sizes", ","], "argument --group-sizes: expected at least one integer, got ','"),
    (["--head-bits", "9"], "argument --head-bits: bit widths must be in 1..8, got '9'"),
    (["--methods", "rtn,serch"], "argument --methods: unknown quantizer(s) ['serch']"),
    (["--methods", ","], "argument --methods: unknown quantizer(s) ','"),
    (["--models", "smollm3"], "argument --models: unknown model(s) ['smollm3']"),
])
def test_eval_rejects_bad_values(argv, message, capsys):
    usage_error(evaluate.parse_args, argv, capsys, message)


def test_eval_run_stops_before_the_models(capsys, no_work):
    usage_error(evaluate.run, ["--decode-tokens", "0"], capsys, "--decode-tokens", "'0'")
    usage_error(cli.main, ["eval", "--repeats", "-5"], capsys, "--repeats", "'-5'")
    usage_error(cli.main, ["eval", "--quick", "--bits", "9"], capsys, "--bits", "'9'")


def test_eval_sweep_defaults_and_quick():
    def sweep(argv):
        a = evaluate.parse_args(argv)
        return a.bits, a.group_sizes, a.zeros, a.repeats, a.decode_tokens

    assert sweep([]) == ([2, 3, 4, 8], [32, 64, 128], "both", 3, 32)
    assert sweep(["--quick"]) == ([4], [32], "yes", 1, 8)
    # options given with --quick are honoured, not dropped
    assert sweep(["--quick", "--bits", "2,8", "--repeats", "2"]) == ([2, 8], [32], "yes", 2, 8)
    # (a list starting with -1 needs the = form: argparse reads "-1,64" as an option)
    assert sweep(["--quick", "--group-sizes=-1,64", "--zeros", "no", "--decode-tokens", "4"]) == \
        ([4], [-1, 64], "no", 1, 4)
    assert sweep(["--group-sizes", "-1"])[1] == [-1]
    a = evaluate.parse_args(["--threads", "1", "--sentences", "8", "--head-bits", "8", "--methods", "rtn,gptq",
                             "--models", "minilm"])
    assert (a.threads, a.sentences, a.head_bits, a.methods, a.models) == (1, 8, [8], ["rtn", "gptq"], "minilm")
    assert evaluate.parse_args([]).methods == ["search"]


# ---------------------------------------------------------------------------
# tune

@pytest.mark.parametrize("argv, message", [
    (["--budget", "nan"], "argument --budget: expected a finite number > 0, got 'nan'"),
    (["--budget", "inf"], "argument --budget: expected a finite number > 0, got 'inf'"),
    (["--budget", "-1"], "argument --budget: expected a finite number > 0, got '-1'"),
    (["--budget", "0"], "argument --budget: expected a finite number > 0, got '0'"),
    (["--bits", "9"], "argument --bits: bit widths must be in 1..8, got '9'"),
    (["--bits", "0"], "argument --bits: bit widths must be in 1..8, got '0'"),
])
def test_tune_rejects_bad_numbers(argv, message, capsys, no_work):
    usage_error(tuning._parser().parse_args, argv, capsys, message)
    usage_error(tuning.run, argv, capsys, message)


def test_tune_accepts_valid_numbers():
    a = tuning._parser().parse_args(["--budget", "2.5", "--bits", "2,8", "--m", "1,8", "--threads", "1"])
    assert (a.budget, a.bits, a.m, a.threads) == (2.5, [2, 8], [1, 8], [1])


def test_tune_model_and_shapes_exclude_each_other(capsys, no_work):
    usage_error(tuning.run, ["--model", "smollm2", "--shapes", "64x128"], capsys,
                 "--model and --shapes exclude each other")


def test_tune_unknown_model_is_a_usage_error(capsys, monkeypatch, no_work):
    """Hugging Face's OSError for a name it cannot find offline becomes a usage error naming the name."""
    def not_found(name, group_size):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find "
                      "them in the cached files.\nCheck your internet connection")
    monkeypatch.setattr(tuning, "_model_shapes", not_found)
    usage_error(tuning.run, ["--model", "no-such-org/no-such-model"], capsys,
                 "argument --model: 'no-such-org/no-such-model' is not smollm2, minilm, or a Hugging Face model",
                 "couldn't find them in the cached files")


def test_tune_model_folder_without_config(tmp_path, capsys, no_work):
    """The real lookup (offline, from an empty folder; imports transformers, loads no model)."""
    from torchao_kernels import models
    try:
        models._transformers()
    except models.ModelNotInstalled as e:
        pytest.skip(str(e))
    usage_error(tuning.run, ["--model", str(tmp_path)], capsys, f"argument --model: {str(tmp_path)!r} is not")
