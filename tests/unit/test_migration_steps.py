"""The shipped migration files: how they split into statements, and that every backend
numbers and names its steps alike."""

from __future__ import annotations

import pytest

from durable_tasks.migrations.steps import BACKENDS, Phase, _parse, load_steps, split_statements


def test_split_keeps_semicolons_inside_quotes_comments_and_dollar_bodies() -> None:
    text = """
    -- a comment; with a semicolon
    CREATE TABLE a (x TEXT DEFAULT 'a;b');
    CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $body$
    BEGIN RAISE NOTICE 'x; %', 1; RETURN 1; END
    $body$;
    /* block; comment */ SELECT "odd;name" FROM a;
    -- a trailing comment only
    """
    statements = split_statements(text)
    assert len(statements) == 3
    assert statements[0].endswith("DEFAULT 'a;b')")
    assert "RETURN 1; END" in statements[1]
    assert statements[2].endswith('SELECT "odd;name" FROM a')


def test_a_file_of_comments_has_no_statements() -> None:
    assert split_statements("-- nothing to do on this backend\n-- at all\n") == []


def test_every_backend_ships_the_same_numbered_steps() -> None:
    names = {backend: [(s.version, s.name, s.phase) for s in load_steps(backend)] for backend in BACKENDS}
    first, *others = names.values()
    assert first[0] == (1, "baseline", Phase.PRE_DEPLOY)
    for other in others:
        assert other == first


def test_headers_set_phase_and_transaction() -> None:
    step = _parse(7, "drop_old", "-- phase: post-deploy\n-- transaction: none\nDROP INDEX CONCURRENTLY x;\n")
    assert step.phase is Phase.POST_DEPLOY
    assert not step.transactional
    assert step.statements == ("DROP INDEX CONCURRENTLY x",)
    assert step.label == "0007_drop_old"
    with pytest.raises(ValueError, match="transaction must be"):
        _parse(8, "bad", "-- transaction: maybe\nSELECT 1;\n")


def test_a_delimiter_line_keeps_a_procedure_body_whole_as_the_mysql_client_does() -> None:
    text = """DROP PROCEDURE IF EXISTS p;

DELIMITER //
CREATE PROCEDURE p()
BEGIN
    SELECT 'a;b';
    SELECT 2;
END //
DELIMITER ;

SELECT 3;
"""
    statements = split_statements(text)
    assert len(statements) == 3
    assert statements[0] == "DROP PROCEDURE IF EXISTS p"
    assert statements[1].startswith("CREATE PROCEDURE p()")
    assert statements[1].endswith("END")
    assert "SELECT 2;" in statements[1]
    assert statements[2] == "SELECT 3"


def test_the_adopted_header_says_whether_a_step_runs_when_tables_are_adopted() -> None:
    assert _parse(2, "proc", "-- adopted: run\nSELECT 1;\n").run_when_adopted
    assert not _parse(3, "table", "CREATE TABLE t (x INT);\n").run_when_adopted
    assert [s.version for s in load_steps("mysql") if s.run_when_adopted] == [2, 13]  # dt_submit, then its v7 ids
