"""prepare_threshold as psycopg reads it, from a setting or a URL, and when it is overruled."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from durable_tasks.errors import ConfigurationError
from durable_tasks.settings import PrepareThreshold, Settings
from durable_tasks.store.pooler import Pooling, decide_prepare_threshold, split_prepare_threshold


@pytest.mark.parametrize(
    ("text", "value"), [("off", None), ("None", None), ("", None), ("auto", "auto"), ("0", 0), ("12", 12)]
)
def test_the_setting_reads_psycopgs_values_as_text(text: str, value: object) -> None:
    assert Settings.model_validate({"prepare_threshold": text}).prepare_threshold == value


@pytest.mark.parametrize("text", ["-1", "sometimes", "1.5"])
def test_anything_else_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="prepare_threshold"):
        Settings.model_validate({"prepare_threshold": text})


def test_the_url_parameter_is_taken_out_of_what_libpq_sees() -> None:
    url, asked = split_prepare_threshold(sa.make_url("postgresql://u@h/db?prepare_threshold=0&sslmode=require"))
    assert asked == 0
    assert dict(url.query) == {"sslmode": "require"}
    assert split_prepare_threshold(sa.make_url("postgresql://u@h/db"))[1] == "auto"
    with pytest.raises(ConfigurationError, match="prepare_threshold"):
        split_prepare_threshold(sa.make_url("postgresql://u@h/db?prepare_threshold=maybe"))


def test_a_transaction_pooler_turns_preparing_off_whatever_was_asked() -> None:
    asks: list[PrepareThreshold] = ["auto", 0, 5]
    for asked in asks:
        assert decide_prepare_threshold(asked, lambda: Pooling.TRANSACTION) is None
        expected = 5 if asked == "auto" else asked
        assert decide_prepare_threshold(asked, lambda: Pooling.DIRECT) == expected
        assert decide_prepare_threshold(asked, lambda: Pooling.SESSION) == expected


def test_off_needs_no_probe() -> None:
    def no_probe() -> Pooling:
        raise AssertionError("probed although preparing was off")

    assert decide_prepare_threshold(None, no_probe) is None
