"""`stash serve` options: each may come from a flag or its STASH_ variable
(flag first), and a setting the server could not honour stops it at start
with exit status 2 instead of serving something else."""

from __future__ import annotations

from pathlib import Path

import pytest

from stash.cli import serve
from stash.web.jsonio import BODY_CAP, IMPORT_BODY_CAP


def settings(argv: list[str], env: dict[str, str] | None = None):
    env = env or {}
    return serve.settings_from(serve.parse(argv, env), env)


def test_defaults_trust_no_proxy_and_keep_the_documented_caps(tmp_path: Path) -> None:
    args = serve.parse([], {})
    s = serve.settings_from(args, {})
    assert (args.host, args.port) == ("127.0.0.1", 8080)
    assert s.trusted_proxies == ()
    assert (s.max_body, s.max_import_body) == (BODY_CAP, IMPORT_BODY_CAP) == (65536, 16777216)
    assert s.public_url is None and s.init == "open"


def test_every_option_reads_its_variable(tmp_path: Path) -> None:
    env = {
        "STASH_DATA": str(tmp_path / "d"),
        "STASH_HOST": "192.0.2.1",
        "STASH_PORT": "9001",
        "STASH_PUBLIC_URL": "https://stash.example",
        "STASH_INIT": "invite",
        "STASH_INVITE_SECRET": "s3",
        "STASH_TRUSTED_PROXY": "127.0.0.1, 10.0.0.0/8 ::1",
        "STASH_MAX_BODY": "8192",
        "STASH_MAX_IMPORT_BODY": "100000",
        "STASH_INIT_PER_MINUTE": "3",
        "STASH_AUTH_FAILURES_PER_MINUTE": "4",
        "STASH_KDF_TIME": "3",
        "STASH_KDF_MEMORY": "4096",
        "STASH_FILE_CIPHER": "none",
    }
    args = serve.parse([], env)
    s = serve.settings_from(args, env)
    assert (args.host, args.port) == ("192.0.2.1", 9001)
    assert s.data_dir == (tmp_path / "d").resolve()
    assert s.public_url == "https://stash.example"
    assert (s.init, s.invite_secret) == ("invite", "s3")
    assert s.trusted_proxies == ("127.0.0.1/32", "10.0.0.0/8", "::1/128")
    assert (s.max_body, s.max_import_body) == (8192, 100000)
    assert (s.init_per_minute, s.auth_failures_per_minute) == (3, 4)
    assert (s.kdf.time_cost, s.kdf.memory_kib, s.file_cipher) == (3, 4096, "none")


def test_a_flag_beats_its_variable() -> None:
    env = {"STASH_PORT": "9001", "STASH_TRUSTED_PROXY": "10.0.0.0/8", "STASH_MAX_BODY": "8192"}
    s = settings(["--trusted-proxy", "127.0.0.1", "--max-body", "5000"], env)
    assert s.trusted_proxies == ("127.0.0.1/32",)
    assert s.max_body == 5000
    assert serve.parse(["--port", "7000"], env).port == 7000


def test_the_clients_url_variable_is_not_the_servers_public_url() -> None:
    assert settings([], {"STASH_URL": "http://127.0.0.1:9"}).public_url is None


def test_an_empty_variable_is_unset() -> None:
    assert serve.parse([], {"STASH_PORT": "", "STASH_INIT": " "}).port == 8080


@pytest.mark.parametrize(
    "env",
    [
        {"STASH_PORT": "eighty"},
        {"STASH_INIT": "sometimes"},
        {"STASH_MAX_BODY": "64k"},
    ],
)
def test_a_bad_variable_is_a_usage_error_naming_it(env, capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        serve.parse([], env)
    assert stop.value.code == 2
    assert f"${next(iter(env))}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--trusted-proxy", "10.0.0.1/8"], "--trusted-proxy"),
        (["--trusted-proxy", "proxy.internal"], "--trusted-proxy"),
        (["--max-body", "100"], "--max-body"),
        (["--max-import-body", str(2**31)], "--max-import-body"),
        (["--init", "invite", "--invite-secret-env", "STASH_TEST_NO_SUCH_VARIABLE"], "STASH_TEST_NO_SUCH_VARIABLE"),
    ],
)
def test_serve_refuses_to_start_on_a_setting_it_cannot_honour(argv, words, tmp_path: Path, capsys) -> None:
    assert serve.main(["--data", str(tmp_path / "d"), *argv]) == 2
    assert words in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


def test_a_shard_is_given_as_user_id_prefixes() -> None:
    assert settings(["--user-id-prefix", "A", "--user-id-prefix", "3f"]).id_prefixes == ("a", "3f")
    assert settings([], {"STASH_USER_ID_PREFIX": "0,1 2"}).id_prefixes == ("0", "1", "2")
    assert settings([]).id_prefixes == ()
    for bad in ("xyz", "12345", "-1"):
        with pytest.raises(serve.ConfigError):
            settings(["--user-id-prefix", bad])
