"""How ``stash serve`` hands its settings to worker processes: every setting
arrives, and no secret is ever in the variable (a process listing or a crash
dump of the environment would show it)."""

from __future__ import annotations

import json
from pathlib import Path

from stash.crypto.keys import KdfParams
from stash.web.settings import SETTINGS_ENV, Settings, from_env, to_env


def test_settings_reach_a_worker_without_their_secrets(monkeypatch, tmp_path: Path):
    sent = Settings(
        data_dir=tmp_path / "data",
        kdf=KdfParams(3, 4096, 1),
        file_cipher="none",
        init="invite",
        invite_secret="invite-s3cret-value",
        operator_token="metrics-t0ken-value",
        public_url="https://stash.example",
        init_per_minute=7,
        auth_failures_per_minute=9,
        workers=3,
    )
    text = to_env(sent, {"invite_secret_env": "MY_INVITE", "metrics_token_env": "MY_METRICS"})
    assert "invite-s3cret-value" not in text and "metrics-t0ken-value" not in text
    assert json.loads(text)["invite_secret_env"] == "MY_INVITE"
    monkeypatch.setenv(SETTINGS_ENV, text)
    monkeypatch.setenv("MY_INVITE", "invite-s3cret-value")
    monkeypatch.setenv("MY_METRICS", "metrics-t0ken-value")
    assert from_env() == sent


def test_an_unset_secret_stays_unset(monkeypatch, tmp_path: Path):
    sent = Settings(data_dir=tmp_path)
    monkeypatch.setenv(
        SETTINGS_ENV,
        to_env(sent, {"invite_secret_env": "STASH_INVITE_SECRET", "metrics_token_env": "STASH_METRICS_TOKEN"}),
    )
    # a variable of that name appearing later does not switch a secret on
    monkeypatch.setenv("STASH_METRICS_TOKEN", "set-after-start")
    got = from_env()
    assert got.operator_token is None and got.invite_secret is None
    assert got == sent
