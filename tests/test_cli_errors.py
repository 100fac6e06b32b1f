"""Every command-line error is one line (plus at most a hint), exit status 2 for usage and 1 for failures, no
traceback unless --debug or REGIS_DEBUG=1 (issue 25, item 1): the bad invocations a new user ran into."""

from __future__ import annotations

import pytest

from cli.errors import describe, report
from regis.errors import ConfigError, IndexFormatError, Interrupted
from tests.test_cli import regis

NO_INDEX_ENV = {"REGIS_INDEX_DIR": "", "REGIS_COLLECTIONS_ROOT": "", "REGIS_DEBUG": ""}  # the cli fixture clears them


def _lines(out) -> list[str]:
    return out.stderr.strip().splitlines()


def _one_error(out, status: int, *words: str) -> None:
    lines = _lines(out)
    assert out.returncode == status, out.stderr
    assert "Traceback" not in out.stderr and 1 <= len(lines) <= 2, out.stderr
    assert lines[0].startswith("error: "), lines
    assert all(line.startswith("hint: ") for line in lines[1:]), lines
    for word in words:
        assert word in out.stderr, (word, out.stderr)


def test_serve_with_a_missing_index_is_one_line(cli, tmp_path):
    _one_error(cli("serve", "--index", tmp_path / "nosuch", "--port", "0"), 1, "nosuch", "regis index build")


def test_serve_without_an_index_names_the_options_not_the_variables(cli):
    out = cli("serve", "--port", "0")
    _one_error(out, 2, "--index DIR", "--collections-root DIR")
    assert "index_dir" not in out.stderr


def test_declining_a_confirmation_is_one_line_and_changes_nothing(cli, tmp_path):
    env = {"REGIS_COLLECTIONS_ROOT": str(tmp_path)}
    assert cli("collections", "create", "demo", "--backbone", "vit-tiny-reg4-test", "--random-init",
               env=env).returncode == 0
    _one_error(cli("collections", "delete", "demo", env=env, stdin="n\n"), 1, "aborted")
    assert "demo" in cli("collections", "list", env=env).stdout
    _one_error(cli("collections", "delete", "nosuch", "--yes", env=env), 1, "nosuch")


def test_usage_errors_are_one_line_with_a_hint(cli, tmp_path):
    _one_error(cli("search", "--nosuch"), 2, "No such option: --nosuch", "regis search --help")
    _one_error(cli("index", "build"), 2, "Missing argument", "regis index build --help")
    _one_error(cli("search", tmp_path, tmp_path / "missing.png"), 2, "missing.png")


def test_a_group_without_its_command_shows_its_commands_and_says_what_is_missing(cli):
    """`regis` alone printed the help and then an empty `error: ` line (the help was the error's message)."""
    out = cli()
    _one_error(out, 2, "no command given: regis needs one of the commands listed above", "regis COMMAND --help")
    assert "search" in out.stdout and "index" in out.stdout  # the help, with the commands, on stdout
    out = cli("index")
    _one_error(out, 2, "no command given: regis index needs one of the commands", "regis index COMMAND --help")
    assert "build" in out.stdout and "info" in out.stdout


def test_debug_shows_the_traceback(cli, tmp_path):
    """Through the real entry point (``python -m regis``) once, and in-process with REGIS_DEBUG=1."""
    out = regis("--debug", "serve", "--index", tmp_path / "nosuch", check=False, env_extra=NO_INDEX_ENV)
    assert out.returncode == 1 and "Traceback" in out.stderr and "IndexFormatError" in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("error: ")
    out = cli("index", "info", tmp_path / "nosuch", env={"REGIS_DEBUG": "1"})
    assert out.returncode == 1 and "Traceback" in out.stderr and "IndexFormatError" in out.stderr


@pytest.mark.parametrize("exc, status, first", [
    (ConfigError("bad value"), 2, "error: bad value"),
    (IndexFormatError("idx is corrupt\nsecond line"), 1, "error: idx is corrupt second line"),
    (Interrupted("interrupted: 3 of 9 embedded, run again to resume"), 130,
     "interrupted: 3 of 9 embedded, run again to resume"),
    (KeyboardInterrupt(), 130, "interrupted"),
    (FileNotFoundError(2, "No such file or directory", "x.png"), 1, "error: No such file or directory: x.png"),
    (RuntimeError("boom"), 1, "error: unexpected RuntimeError: boom"),
])
def test_each_kind_of_error_has_its_status_and_one_line(capsys, exc, status, first):
    assert report(exc) == status
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0] == first and len(lines) <= 2
    if isinstance(exc, RuntimeError):
        assert lines[1] == "hint: run again with REGIS_DEBUG=1 (or regis --debug ...) to see the traceback"
    assert describe(ConfigError("x", hint="do y"))[1] == "do y"
