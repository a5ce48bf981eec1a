"""Where each replicated file goes under a replica target, and the
environment Litestream is run in for it (service/ops/replica.py, ``Target``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stash.service.ops.replica import ReplicaError, Target, config

REL = "users/0123456789abcdef/keyring.db"
KEYS = {"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "secret"}


def oracle(url: str, rel: str) -> str:
    """A URL's path ends at its first "?" (then the query) or "#" (then the
    fragment): ``rel`` goes at the end of the path, one "/" between."""
    cut = min((i for i in (url.find("?"), url.find("#")) if i >= 0), default=len(url))
    head, tail = url[:cut], url[cut:]
    scheme, rest = head.split("://", 1)
    authority, _, path = rest.partition("/")
    path = "/".join(part for part in path.split("/") if part)
    return f"{scheme}://{authority}/{path + '/' if path else ''}{rel}{tail}"


@pytest.mark.parametrize(
    "url",
    [
        "s3://stash-fleet/a/e1?endpoint=https://s3.example.com",
        "s3://stash-fleet/a/e1/?endpoint=http://127.0.0.1:8333&region=eu-1",
        "s3://stash-fleet?endpoint=https://s3.example.com/",
        "s3://stash-fleet/a",
        "sftp://me@host:22/srv/replica",
        "sftp://me@host:22/srv/replica#frag",
    ],
)
def test_a_relative_path_joins_the_urls_path_never_its_query(url: str):
    joined = Target.parse(url).at(REL)["url"]
    assert joined == oracle(url, REL)


def test_every_file_of_the_configuration_stays_under_the_path(tmp_path: Path):
    url = "s3://b/host-a/e2?endpoint=http://127.0.0.1:9000"
    dbs: list[dict[str, dict[str, str]]] = config(tmp_path, Target.parse(url))["dbs"]  # type: ignore[assignment]
    urls = [db["replica"]["url"] for db in dbs]
    assert urls == [
        "s3://b/host-a/e2/users?endpoint=http://127.0.0.1:9000",
        "s3://b/host-a/e2/users?endpoint=http://127.0.0.1:9000",
        "s3://b/host-a/e2/roster.db?endpoint=http://127.0.0.1:9000",
    ]


def test_litestreams_environment_has_no_ca_bundle_and_s3_needs_both_keys(tmp_path: Path):
    s3 = Target.parse("s3://b/p?endpoint=http://127.0.0.1:9000")
    env = s3.environment({**KEYS, "AWS_CA_BUNDLE": "/etc/ssl/ca.pem", "HOME": "/h"})
    assert env == {**KEYS, "HOME": "/h"}
    for missing in ({"AWS_ACCESS_KEY_ID": "id"}, {"AWS_SECRET_ACCESS_KEY": "s"}, {}, {**KEYS, "AWS_ACCESS_KEY_ID": ""}):
        with pytest.raises(ReplicaError) as refused:
            s3.environment(missing)
        assert "AWS_ACCESS_KEY_ID" in str(refused.value) and "AWS_SECRET_ACCESS_KEY" in str(refused.value)
    litestream_names = {"LITESTREAM_ACCESS_KEY_ID": "id", "LITESTREAM_SECRET_ACCESS_KEY": "secret"}
    assert s3.environment(litestream_names) == litestream_names  # Litestream's own names for them
    # A folder needs no keys; S3 settings that hold their own keys neither.
    assert Target.parse(str(tmp_path)).environment({"AWS_CA_BUNDLE": "x"}) == {}
    settings = tmp_path / "replica.json"
    settings.write_text(
        json.dumps({"type": "s3", "bucket": "b", "path": "p", "access-key-id": "i", "secret-access-key": "s"})
    )
    assert Target.parse(str(settings)).environment({}) == {}
    settings.write_text(json.dumps({"type": "s3", "bucket": "b", "path": "p"}))
    with pytest.raises(ReplicaError):
        Target.parse(str(settings)).environment({})
