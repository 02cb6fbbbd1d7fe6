"""What InnoDB reads of a row with a long value, statement by statement (MySQL/MariaDB).

    python -m benchmarks.mysql_row_reads [--rows 300] [--bytes 1000000] [--rounds 3]

Fills a scratch table (``dt_probe_rows``, dropped at the end) with ``--rows`` rows carrying
``--bytes`` of random base64 in a MEDIUMTEXT column beside a short one, then times the shapes of
statement the store runs on ``dt_tasks``, over every row: a plain read of the short columns, the
same with the long value named (as a claim's ``CASE`` names the payload), a shared lock, an
exclusive lock (``FOR UPDATE``, what a claim and a result's commit take first) and an update of
a short column (what each state change does). Prints each one's median milliseconds and its cost
per row and megabyte. Reads ``DT_BENCH_MYSQL_URL`` (default: the machine's MariaDB).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import sqlalchemy as sa

from benchmarks.bench_scale import payload_body

URL = os.environ.get("DT_BENCH_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test")
TABLE = "dt_probe_rows"
#: Each shape's statement over every row of the table (``:ids`` the rows' keys).
SHAPES = {
    "read, short columns only": f"SELECT id, state FROM {TABLE} WHERE id IN :ids ORDER BY id",
    "read, long value named in a CASE": f"SELECT id, CASE WHEN size <= 65536 THEN body END FROM {TABLE} "
    "WHERE id IN :ids ORDER BY id",
    "LOCK IN SHARE MODE, short columns": f"SELECT id, state FROM {TABLE} WHERE id IN :ids ORDER BY id "
    "LOCK IN SHARE MODE",
    "FOR UPDATE, short columns": f"SELECT id, state FROM {TABLE} WHERE id IN :ids ORDER BY id FOR UPDATE",
    "UPDATE of a short column": f"UPDATE {TABLE} SET state = :state WHERE id IN :ids",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=300)
    ap.add_argument("--bytes", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    engine = sa.create_engine(URL)
    ids = [f"row{i:06d}" for i in range(a.rows)]
    body = payload_body(a.bytes)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {TABLE}")
        conn.exec_driver_sql(
            f"CREATE TABLE {TABLE} (id VARCHAR(36) PRIMARY KEY, state VARCHAR(16) NOT NULL, "
            "body MEDIUMTEXT NOT NULL, size INTEGER NOT NULL) ENGINE=InnoDB CHARACTER SET utf8mb4"
        )
        for key in ids:
            conn.execute(
                sa.text(f"INSERT INTO {TABLE} VALUES (:id, 'A', :body, :size)"),
                {"id": key, "body": body, "size": a.bytes},
            )
    times: dict[str, list[float]] = {name: [] for name in SHAPES}
    try:
        for turn in range(a.rounds):
            for name, statement in SHAPES.items():  # one after the other, each round: the same machine
                query = sa.text(statement).bindparams(sa.bindparam("ids", expanding=True))
                started = time.perf_counter()
                with engine.begin() as conn:
                    result = conn.execute(query, {"ids": ids, "state": "AB"[turn % 2]})
                    if result.returns_rows:
                        result.fetchall()
                times[name].append((time.perf_counter() - started) * 1000)
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE {TABLE}")
        engine.dispose()
    megabytes = a.bytes / 1e6
    print(f"{a.rows} rows of {a.bytes:,} bytes, {a.rounds} rounds, medians")
    for name, measured in times.items():
        ms = statistics.median(measured)
        print(f"  {name:36} {ms:9.1f} ms  {ms / a.rows / megabytes:6.2f} ms per row and MB")


if __name__ == "__main__":
    main()
