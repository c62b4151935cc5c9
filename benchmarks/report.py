"""The table (rich) and the JSON document."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .core import Row

VERDICT_STYLE = {"meets": "green", "misses": "bold red", "info": "dim", "n/a": "yellow",
                 "error": "bold red"}


def fmt(value: float | None, unit: str) -> str:
    if value is None or not math.isfinite(value):
        return "—"
    if unit in ("s", "cpu s"):
        suffix = " cpu" if unit == "cpu s" else ""
        for scale, name in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
            if abs(value) >= scale or scale == 1e-6:
                return f"{value / scale:.3g} {name}{suffix}"
    if unit == "bytes":
        for scale, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
            if abs(value) >= scale:
                return f"{value / scale:.3g} {name}"
        return f"{value:.0f} B"
    if unit == "count":
        return f"{value:.0f}"
    return f"{value:.3g} {unit}"


def fmt_ratio(value: float | None) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.2f}x"


def fmt_goal(row: Row) -> str:
    if row.goal is None:
        return "—"
    if row.unit == "count":
        return f"== {row.goal:g}"
    return f"<= {row.goal:g}" + ("" if row.group.startswith("5") else "x")


def table(rows: list[Row], meta: dict[str, Any]) -> Table:
    out = Table(title=f"whitney-kit benchmarks ({meta['preset']}, {meta['wall_s']:.0f} s, "
                      f"{meta['cpu_count']} cpus, load {_load(meta)})",
                show_lines=False, expand=False)
    for column, justify in (("row", "left"), ("measured", "right"), ("floor", "right"),
                            ("ratio", "right"), ("goal", "right"), ("verdict", "left")):
        out.add_column(column, justify=justify, no_wrap=column != "row")  # type: ignore[arg-type]
    group = None
    for row in rows:
        if row.group != group:
            group = row.group
            out.add_row(f"[bold]{group}[/bold]", "", "", "", "", "")
        ratio = fmt_ratio(row.ratio)
        if row.group.startswith("5") and row.ratio is not None:
            ratio = f"{row.ratio:.4f}"
        out.add_row(escape(row.name), fmt(row.measured, row.unit), fmt(row.floor, row.unit), ratio,
                    fmt_goal(row), f"[{VERDICT_STYLE.get(row.verdict, '')}]{row.verdict}[/]")
    return out


def _load(meta: dict[str, Any]) -> str:
    load = meta.get("loadavg_before")
    return "?" if not load else f"{load[0]:.2f}"


def notes(rows: list[Row]) -> list[str]:
    return [f"{row.group} / {row.name.strip()}: {row.note}" for row in rows if row.note]


def print_report(rows: list[Row], meta: dict[str, Any], console: Console | None = None,
                 *, show_notes: bool = True) -> None:
    if console is None:
        console = Console()
        if not console.is_terminal:
            console = Console(width=120)
    console.print(table(rows, meta))
    if show_notes:
        console.print("[bold]notes[/bold]")
        for line in notes(rows):
            console.print(f"  {line}", highlight=False, soft_wrap=True, markup=False)
    missed = [row for row in rows if row.verdict in ("misses", "error")]
    summary = (f"{sum(r.verdict == 'meets' for r in rows)} meet, {len(missed)} miss or error, "
               f"{sum(r.verdict == 'n/a' for r in rows)} n/a")
    console.print(summary)


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def document(rows: list[Row], meta: dict[str, Any]) -> dict[str, Any]:
    return _clean({"meta": meta, "rows": [row.as_dict() for row in rows]})


def write_json(path: str | Path, rows: list[Row], meta: dict[str, Any]) -> None:
    Path(path).write_bytes(orjson.dumps(document(rows, meta), option=orjson.OPT_INDENT_2))


def markdown(rows: list[Row], meta: dict[str, Any], groups: tuple[str, ...] = ()) -> str:
    """The table as Markdown (for README): rows of ``groups`` (group-name prefixes; all when
    empty), step rows included, with the run's preset, wall time, CPUs and load."""
    lines = [f"`python -m benchmarks` ({meta['preset']}, {meta['wall_s']:.0f} s, "
             f"{meta['cpu_count']} CPUs, load {_load(meta)} before the run):", "",
             "| row | measured | floor | ratio | goal | verdict |", "|---|---:|---:|---:|---:|---|"]
    group = None
    for row in rows:
        if groups and not row.group.startswith(groups):
            continue
        if row.group != group:
            group = row.group
            lines.append(f"| **{group}** | | | | | |")
        name = row.name.strip()
        name = f"&nbsp;&nbsp;{name}" if row.name.startswith("  ") else name
        lines.append(f"| {name} | {fmt(row.measured, row.unit)} | {fmt(row.floor, row.unit)} | "
                     f"{fmt_ratio(row.ratio)} | {fmt_goal(row)} | {row.verdict} |")
    return "\n".join(lines) + "\n"
