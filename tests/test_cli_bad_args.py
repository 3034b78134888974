"""Bad command-line arguments are refused with a message naming the option and the
value, before anything is asked of a daemon or written (issue 26).

Found: ``status --timeout`` and every operator command's ``--answer-timeout`` took any
float: a negative one made the wait for a daemon's answer endless (ZeroMQ's poll
waits for ever on a negative timeout), NaN crashed the command.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from adaptd import cli

BAD = [
    (["status", "--timeout", "-1"], "--timeout", "'-1'"),
    (["status", "--timeout", "nan"], "--timeout", "'nan'"),
    (["status", "--timeout", "soon"], "--timeout", "'soon'"),
    (["save-now", "--all", "--answer-timeout", "0"], "--answer-timeout", "'0'"),
    (["pause", "--all", "--answer-timeout", "inf"], "--answer-timeout", "'inf'"),
    (["set-policy", "--job", "j", "young", "--answer-timeout", "-3"], "--answer-timeout", "'-3'"),
    (["drain", "--timeout", "0"], "--timeout", "got 0"),
    (["drain", "--timeout", "nan"], "--timeout", "got nan"),
    (["serve", "--silence-timeout", "0", "--check-config"], "--silence-timeout", "got 0"),
    (["serve", "--metrics-listen", "nine", "--check-config"], "--metrics-listen", "'nine'"),
    (["serve", "--etcd", "ftp://x", "--check-config"], "--etcd", "'ftp://x'"),
    (["simulate", "--scenario", "seed-article", "--policy", "daly", "--seeds", "0"], "--seeds",
     "got 0"),
    (["simulate", "--scenario", "no-such", "--policy", "daly"], "--scenario", "'no-such'"),
    (["simulate", "--scenario", "seed-article", "--policy", "nosuch"], "--policy", "nosuch"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "option", "value"), BAD, ids=[" ".join(b[0]) for b in BAD])
def test_a_bad_argument_names_the_option_and_value(
    argv: list[str], option: str, value: str, capsys, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))  # no daemon's socket here
    empty = tmp_path / "adaptd.toml"
    empty.write_text("")
    monkeypatch.setenv("ADAPTD_CONFIG", str(empty))  # not the host's config
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    err = capsys.readouterr().err
    assert code in (1, 2), (code, err)
    assert option in err and value in err, err
    assert "no adaptd daemon" not in err  # refused before asking one
