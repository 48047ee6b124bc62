"""The check every command-line test makes of a refused argument: an argparse
usage error (exit 2, the usage line) whose message holds each needle."""
import pytest


def usage_error(fn, argv, capsys, *needles) -> str:
    """Calls fn(argv), which must exit with a usage error; returns its stderr."""
    with pytest.raises(SystemExit) as e:
        fn(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2, (argv, e.value.code, err)
    assert "usage:" in err, (argv, err)
    for needle in needles:
        assert needle in err, (argv, needle, err)
    return err
