"""The first week's stumbles of the client (issue 30), run in process against
the session's real server: a refused token names STASH_TOKEN, ``null``
restores a size, the one-file client says where ``mcp`` and ``serve`` are,
and its messages name a way forward."""

from __future__ import annotations

import pytest

from stash import client
from stash.cli.main import HOST_VERBS


def run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, url: str, token: str | None, *argv: str
) -> tuple[int, str, str]:
    monkeypatch.setenv("STASH_URL", url)
    if token is None:
        monkeypatch.delenv("STASH_TOKEN", raising=False)
    else:
        monkeypatch.setenv("STASH_TOKEN", token)
    code = client.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_refused_token_names_stash_token_not_a_header(monkeypatch, capsys, base_url: str, token: str) -> None:
    wrong = token[:-1] + ("A" if token[-1] != "A" else "B")
    code, _, err = run(monkeypatch, capsys, base_url, wrong, "wake")
    assert code == client.REFUSED
    assert "STASH_TOKEN" in err and "Authorization" not in err and "init URL" in err


def test_config_null_restores_the_default_as_the_refusal_offers(monkeypatch, capsys, base_url: str, token: str) -> None:
    code, out, _ = run(monkeypatch, capsys, base_url, token, "config", "WAKE_LINES=40")
    assert code == 0 and "WAKE_LINES=40  (default" in out
    code, out, err = run(monkeypatch, capsys, base_url, token, "config", "WAKE_LINES=null")
    assert code == 0, err
    assert any(line.startswith("WAKE_LINES=") and "(default" not in line for line in out.splitlines())


def test_the_one_file_client_says_where_the_package_verbs_are(monkeypatch, capsys, base_url: str) -> None:
    assert set(client.PACKAGE_VERBS) == set(HOST_VERBS)
    for verb in ("mcp", "serve"):
        code, _, err = run(monkeypatch, capsys, base_url, None, verb)
        assert code == client.USAGE
        assert "invalid choice" not in err and "installed package" in err and "pip install" in err


def test_resending_a_settled_block_is_done_not_a_failure(monkeypatch, capsys, base_url: str, token: str) -> None:
    for line in ("first", "second"):
        assert run(monkeypatch, capsys, base_url, token, "note", line)[0] == 0
    code, _, err = run(monkeypatch, capsys, base_url, token, "nap", "0-1", "the two first lines")
    assert code == 0, err
    code, out, err = run(monkeypatch, capsys, base_url, token, "nap", "0-1", "the two first lines")
    assert code == 0, err
    assert "already settled" in out and "nothing was saved" not in err


def test_init_without_an_address_suggests_init_url(monkeypatch, capsys) -> None:
    monkeypatch.delenv("STASH_URL", raising=False)
    code = client.main(["init"])
    err = capsys.readouterr().err
    assert code == client.USAGE and "init URL" in err and "http://127.0.0.1:8080" in err


def test_note_dash_with_empty_input_speaks_of_standard_input(monkeypatch, capsys, base_url: str, token: str) -> None:
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    code, _, err = run(monkeypatch, capsys, base_url, token, "note", "-")
    assert code == client.USAGE
    assert "standard input" in err and "in quotes" not in err and "STASH_END" in err


def test_the_clients_first_wake_part_has_the_part_header(monkeypatch, capsys, base_url: str, token: str, http) -> None:
    for i in range(6):
        assert run(monkeypatch, capsys, base_url, token, "note", f"header line {i} " + "x" * 200)[0] == 0
    assert run(monkeypatch, capsys, base_url, token, "config", "PART_CHARS=600")[0] == 0
    for b in ("0-1", "2-3", "0-3", "4-5"):
        run(monkeypatch, capsys, base_url, token, "nap", b, f"summary {b}")
    _, out, err = run(monkeypatch, capsys, base_url, token, "wake")
    curl = http.send("GET", "/wake", {"Authorization": f"Bearer {token}", "Accept": "text/plain"}).text
    assert curl.startswith("Your memory, part 1 of "), curl
    assert out.splitlines()[0] == curl.splitlines()[0], (out, err)


def test_the_skills_file_form_imports_2000_lines(base_url: str, token: str, tmp_path) -> None:
    import subprocess

    from tests.support.server import CLI_TIMEOUT, REPO

    skill = (REPO / "skill" / "SKILL.md").read_text(encoding="utf-8")
    line = next(x.strip() for x in skill.splitlines() if "--data-binary @memories.txt" in x)
    (tmp_path / "memories.txt").write_text(
        "".join(f"2020-01-01 imported line {i:04d} " + "y" * 80 + "\n" for i in range(2000))
    )
    done = subprocess.run(
        ["/bin/sh", "-c", line],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        env={"PATH": "/usr/bin:/bin", "STASH_URL": base_url, "STASH_TOKEN": token},
    )
    assert done.returncode == 0 and "Imported 2000" in done.stdout, (done.stdout, done.stderr)
