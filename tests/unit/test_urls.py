"""safe_url: the password of any URL the runtime shows is masked, and nothing else changes."""

from __future__ import annotations

import pytest

from durable_tasks.urls import safe_url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://dt:s3cret@127.0.0.1:6379/0", "redis://dt:***@127.0.0.1:6379/0"),
        ("rediss://:s3cret@h/0?ssl_ca_certs=/pki/ca.pem", "rediss://:***@h/0?ssl_ca_certs=/pki/ca.pem"),
        ("redis+cluster://dt:p@ss@h1:7000,h2:7001/0", "redis+cluster://dt:***@h1:7000,h2:7001/0"),
        ("redis://h:6379/0?password=s3cret&db=1", "redis://h:6379/0?password=***&db=1"),
        ("postgresql+psycopg://app:s3cret@db:5432/prod", "postgresql+psycopg://app:***@db:5432/prod"),
        ("postgres://app:s3cret@db/prod?sslmode=require", "postgres://app:***@db/prod?sslmode=require"),
        ("postgresql://app@db/prod?options=-csearch_path%3Dx", "postgresql://app@db/prod?options=-csearch_path%3Dx"),
        ("sqlite:////var/lib/app/dt.sqlite3", "sqlite:////var/lib/app/dt.sqlite3"),
        ("not a url at all", "not a url at all"),
    ],
)
def test_safe_url_masks_passwords_and_keeps_the_rest(url: str, shown: str) -> None:
    assert safe_url(url) == shown
    assert "s3cret" not in safe_url(url)
