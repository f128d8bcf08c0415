"""The one error contract of every `aot` command (`aot_transformers.errors`, applied by `cli.main`): bad input is one
line naming the argument and value with exit code 2; a failed run is one line with exit code 1, its traceback in a log
file (or on the terminal with `--debug`)."""

from __future__ import annotations

import pytest

from aot_transformers import cli
from aot_transformers.errors import RunError, UsageError, report_error, run_command


def test_usage_error_names_argument_value_and_what_is_allowed():
    error = UsageError("too small", argument="--lora_r", value=0, allowed="a positive integer")
    assert str(error) == "--lora_r 0: too small (allowed: a positive integer)"
    assert isinstance(error, ValueError)


def test_argparse_errors_are_one_line_with_exit_2(capsys):
    for argv in (["verify"], ["no-such-command"]):
        with pytest.raises(SystemExit) as exited:
            cli.main(argv)
        assert exited.value.code == 2
        assert capsys.readouterr().err.count("\n") == 1
    with pytest.raises(SystemExit):
        cli.main(["verify"])
    assert capsys.readouterr().err.startswith("aot verify: error: the following arguments are required: folder")


def test_a_value_the_library_rejects_is_bad_input(capsys):
    assert run_command(lambda: (_ for _ in ()).throw(ValueError("knn_k must be positive, got -1"))) == 2
    assert capsys.readouterr().err == "aot: error: knn_k must be positive, got -1\n"


def test_a_missing_folder_is_bad_input(tmp_path, capsys):
    assert cli.main(["verify", str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err == f"aot verify: error: folder {str(tmp_path / 'missing')!r}: no such folder\n"


@pytest.mark.parametrize("debug", [False, True])
def test_a_failed_run_is_exit_1_with_the_traceback_in_a_log_or_behind_debug(tmp_path, capsys, monkeypatch, debug):
    monkeypatch.setenv("AOT_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("AOT_DEBUG", "")  # recorded, so the "1" that `--debug` sets is undone after the test

    def broken(args):
        raise RuntimeError("disk on fire")

    parser = cli.build_parser()
    original = parser.parse_args
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    monkeypatch.setattr(
        parser, "parse_args", lambda argv: original(argv).__class__(**{**vars(original(argv)), "func": broken})
    )
    assert cli.main(["--debug", "info"] if debug else ["info"]) == 1
    err = capsys.readouterr().err
    assert "aot info: error: RuntimeError: disk on fire" in err
    logs = list((tmp_path / "logs").glob("aot-error-*.log")) if (tmp_path / "logs").exists() else []
    if debug:
        assert "Traceback (most recent call last)" in err and not logs
    else:
        assert "Traceback" not in err and err.count("\n") == 1
        assert len(logs) == 1 and "disk on fire" in logs[0].read_text() and str(logs[0]) in err


def test_run_command_codes(capsys):
    assert run_command(lambda: None) == 0
    assert run_command(lambda: 3) == 3

    def fail(error):
        raise error

    assert run_command(lambda: fail(UsageError("bad", argument="--x", value=1))) == 2
    assert run_command(lambda: fail(RunError("push refused"))) == 1
    assert report_error(KeyboardInterrupt()) == 130
    err = capsys.readouterr().err
    assert "error: --x 1: bad" in err and "error: push refused" in err


def test_an_error_raised_while_an_interrupt_unwinds_is_reported_as_the_interrupt(capsys):
    def job():
        try:
            raise KeyboardInterrupt("SIGTERM")
        finally:  # cleanup that fails on the way out, as `datasets`' pool does (a TimeoutError)
            raise TimeoutError

    assert run_command(job, prog="aot x") == 130
    assert capsys.readouterr().err.strip() == "aot x: interrupted: SIGTERM"
    assert run_command(lambda: (_ for _ in ()).throw(TimeoutError("slow")), prog="aot x") == 1  # not an interrupt
