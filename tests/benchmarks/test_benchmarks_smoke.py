"""Smoke test of ``python -m benchmarks``: every row is produced, with finite numbers.

Runs the command's own ``main`` in-process with the ``tiny`` preset (small sizes, a uvicorn
child process for groups 1 and 6, suites skipped). Timings are never asserted here: the
numbers of a tiny run mean nothing, only their presence and finiteness do.
"""

from __future__ import annotations

import math

import orjson

from benchmarks.__main__ import main
from benchmarks.runner import GROUP_NAMES

EXPECTED_GROUPS = {name for key, name in GROUP_NAMES.items() if key != "8"}


def test_every_benchmark_row_is_produced_with_finite_numbers(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["--preset", "tiny", "--skip-suites", "--blas-threads", "0",
                 "--json", str(out)]) == 0
    document = orjson.loads(out.read_bytes())
    rows = document["rows"]
    assert {row["group"] for row in rows} == EXPECTED_GROUPS
    assert [row for row in rows if row["verdict"] == "error"] == []
    for row in rows:
        for key in ("measured", "floor", "ratio"):
            value = row[key]
            assert isinstance(value, (int, float)) and math.isfinite(value), (row["name"], key)
        assert row["verdict"] in {"meets", "misses", "info"}, row
    names = " ".join(row["name"] for row in rows)
    for expected in ("in-process", "uvicorn", "whole path", "linearity", "per saved version",
                     "errors"):
        assert expected in names
    assert document["meta"]["preset"] == "tiny"
    printed = capsys.readouterr().out
    assert "whitney-kit benchmarks" in printed and "verdict" in printed
