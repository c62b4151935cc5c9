"""Reports of a run: a rich table per rule family on a terminal, plain lines elsewhere (a log,
a pipe: one line per check, details whole), JSON (``--report-json``), JUnit XML."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path
from typing import Any, TextIO

from .registry import FAMILIES, Status
from .runner import CheckOutcome, Summary

__all__ = ["print_report", "print_plain", "plain_lines", "header", "footer", "to_json",
           "write_json", "write_junit", "rule_status"]

_STYLE = {Status.PASS: "green", Status.FAIL: "bold red", Status.ERROR: "bold red",
          Status.WARN: "yellow", Status.UNSUPPORTED: "cyan", Status.NOT_RUN: "dim",
          Status.STRICT: "magenta"}
# Worst first: a rule's status is the worst of its checks'.
_SEVERITY = [Status.ERROR, Status.FAIL, Status.STRICT, Status.WARN, Status.NOT_RUN,
             Status.UNSUPPORTED, Status.PASS]


def rule_status(outcomes: list[CheckOutcome]) -> Status:
    present = {o.status for o in outcomes}
    return next(s for s in _SEVERITY if s in present)


def _by_family(summary: Summary) -> dict[str, list[CheckOutcome]]:
    grouped: dict[str, list[CheckOutcome]] = defaultdict(list)
    for outcome in summary.outcomes:
        grouped[outcome.check.family].append(outcome)
    return {family: grouped[family] for family in FAMILIES if family in grouped}


def plain_lines(outcome: CheckOutcome, *, verbose: bool = False) -> list[str]:
    """One line per check (status, id, level); a failure, warning or strict-only finding is
    expanded on the lines below it, whole (nothing cut to a terminal width)."""
    check = outcome.check
    level = check.level.value + (f" ({check.capability})" if check.capability else "")
    lines = [f"{outcome.status.value.upper():<11} {check.id}  [{level}]"]
    if outcome.detail and (verbose or outcome.status is not Status.PASS):
        lines.append(f"            {outcome.detail}")
    return lines


def footer(summary: Summary, *, markup: bool = False) -> list[str]:
    """Totals, resources, budget and the verdict, as lines (rich markup when asked)."""
    esc = _escape if markup else (lambda text: text)
    res = summary.resources
    closed = "all closed" if res.all_closed else esc(f"NOT all closed: {res.leaked[:5]}")
    lines = ["  ".join(f"{k}: {v}" for k, v in summary.counts().items() if v),
             f"resources: {res.sessions_created} sessions and {res.runs_created} runs created, "
             f"{res.sessions_closed} sessions closed, {res.runs_terminal} runs terminal: "
             f"{closed}",
             f"budget: {summary.requests} requests, {summary.tokens_sent} tokens in accepted "
             f"requests, {summary.sample_tokens_requested} sample tokens requested, "
             f"{summary.seconds:.1f}s"]
    if summary.interrupted:
        lines.append(_style("bold yellow", "interrupted", markup)
                     + ": resources were cleaned up; exit code 130")
    else:
        lines.append(_verdict(summary, markup))
    return lines


def header(summary_or_target: Summary | str, profile: str = "", run_tag: str = "") -> str:
    if isinstance(summary_or_target, Summary):
        target = summary_or_target.target
        profile, run_tag = summary_or_target.profile, summary_or_target.run_tag
    else:
        target = summary_or_target
    tag = f" (run {run_tag})" if run_tag else ""
    return f"Whitney conformance, profile {profile}, against {target}{tag}"


def print_plain(summary: Summary, stream: TextIO | None = None, *, verbose: bool = False,
                checks: bool = True) -> None:
    """The layout for a log or a pipe: plain lines, no table, no width limit. ``checks=False``
    prints only the header and footer (the check lines were streamed as they came)."""
    stream = stream or sys.stdout
    print(header(summary), file=stream)
    if checks:
        for outcome in summary.outcomes:
            for line in plain_lines(outcome, verbose=verbose):
                print(line, file=stream)
    for line in footer(summary):
        print(line, file=stream)
    stream.flush()


def print_report(summary: Summary, console: Any = None, *, verbose: bool = False) -> None:
    """One table per rule family, then totals, resources and the verdict (a terminal)."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    console.print(_style("bold", "Whitney conformance", True)
                  + _escape(header(summary)[len("Whitney conformance"):]))
    for family, outcomes in _by_family(summary).items():
        counts = {s: sum(o.status is s for o in outcomes) for s in Status}
        caption = ", ".join(f"{n} {s.value}" for s, n in counts.items() if n)
        table = Table(title=f"{family}  ({caption})", title_justify="left", expand=True,
                      show_lines=False)
        table.add_column("rule", no_wrap=True)
        table.add_column("check", no_wrap=True)
        table.add_column("level", no_wrap=True)
        table.add_column("status", no_wrap=True)
        table.add_column("detail", overflow="fold", ratio=1)
        for outcome in outcomes:
            check = outcome.check
            level = check.level.value + (f" ({check.capability})" if check.capability else "")
            detail = outcome.detail if (verbose or outcome.status in (Status.FAIL, Status.ERROR)
                                        ) else outcome.detail[:300]
            if outcome.status is Status.PASS:
                detail = check.title  # what was verified
            table.add_row(check.rule, check.name, level,
                          _style(_STYLE[outcome.status], outcome.status.value, True),
                          _escape(detail))
        console.print(table)
    for line in footer(summary, markup=True):
        console.print(line)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def _style(style: str, text: str, markup: bool) -> str:
    return f"[{style}]{text}[/]" if markup else text


def _verdict(summary: Summary, markup: bool = False) -> str:
    esc = _escape if markup else (lambda text: text)
    strict = esc(", ".join(sorted(summary.strict_only_rules())))
    passes = "every MUST (and declared capability) passes"
    not_run = [o for o in summary.outcomes if o.status is Status.NOT_RUN]
    if not_run and summary.exit_code != 1:
        passes = (f"no failure among the checks that ran; {len(not_run)} not run "
                  f"({not_run[0].detail})")
    if summary.exit_code == 1:
        failing = esc(", ".join(sorted(summary.failing_rules())))
        text = _style("bold red", f"failing rules: {failing}", markup)
        return text + (f"; strict-only findings (not failures): {strict}" if strict else "")
    if summary.exit_code == 3:
        return (_style("bold green", passes, markup) + "; " + _style(
            "magenta", f"strict-only findings (the mock's exact shapes, not contract failures): "
                       f"{strict}", markup))
    if summary.profile == "strict":
        return _style("bold green", f"{passes}, and every response has the mock's exact "
                                    f"shapes (strict)", markup)
    return _style("bold green", passes, markup)


def to_json(summary: Summary) -> dict[str, Any]:
    rules: dict[str, Any] = {}
    grouped: dict[str, list[CheckOutcome]] = defaultdict(list)
    for outcome in summary.outcomes:
        grouped[outcome.check.rule].append(outcome)
    for rule, outcomes in grouped.items():
        rules[rule] = {"status": rule_status(outcomes).value,
                       "levels": sorted({o.check.level.value for o in outcomes}),
                       "checks": [o.check.id for o in outcomes]}
    res = summary.resources
    return {
        "target": summary.target,
        "profile": summary.profile,
        "run_tag": summary.run_tag,
        "exit_code": summary.exit_code,
        "interrupted": summary.interrupted,
        "seconds": round(summary.seconds, 3),
        "counts": summary.counts(),
        "failing_rules": sorted(summary.failing_rules()),
        "strict_only_rules": sorted(summary.strict_only_rules()),
        "rules": rules,
        "checks": [{
            "id": o.check.id, "rule": o.check.rule, "family": o.check.family,
            "level": o.check.level.value, "capability": o.check.capability,
            "title": o.check.title, "status": o.status.value, "detail": o.detail,
            "strict_only": o.strict, "seconds": round(o.seconds, 4),
        } for o in summary.outcomes],
        "resources": {
            "sessions_created": res.sessions_created, "sessions_closed": res.sessions_closed,
            "runs_created": res.runs_created, "runs_terminal": res.runs_terminal,
            "all_closed": res.all_closed, "leaked": res.leaked,
        },
        "requests": summary.requests,
        "tokens_sent": summary.tokens_sent,
        "sample_tokens_requested": summary.sample_tokens_requested,
    }


def write_json(summary: Summary, path: str | Path) -> None:
    Path(path).write_text(json.dumps(to_json(summary), indent=2) + "\n", encoding="utf-8")


def write_junit(summary: Summary, path: str | Path) -> None:
    """JUnit XML: one testsuite per family, one testcase per check (fail/error -> failure or
    error, unsupported/not_run -> skipped, warn and strict -> passed with system-out)."""
    root = ET.Element("testsuites", name=f"whitney-conformance ({summary.profile})",
                      tests=str(len(summary.outcomes)), time=f"{summary.seconds:.3f}")
    for family, outcomes in _by_family(summary).items():
        suite = ET.SubElement(root, "testsuite", name=family, tests=str(len(outcomes)),
                              failures=str(sum(o.status is Status.FAIL for o in outcomes)),
                              errors=str(sum(o.status is Status.ERROR for o in outcomes)),
                              skipped=str(sum(o.status in (Status.UNSUPPORTED, Status.NOT_RUN)
                                              for o in outcomes)))
        for outcome in outcomes:
            case = ET.SubElement(suite, "testcase", classname=f"conformance.{family}",
                                 name=outcome.check.id, time=f"{outcome.seconds:.4f}")
            message = outcome.detail[:2000]
            if outcome.status is Status.FAIL:
                element = ET.SubElement(case, "failure", message=message[:500],
                                        type=outcome.check.level.value)
                element.text = message
            elif outcome.status is Status.ERROR:
                ET.SubElement(case, "error", message=message[:500]).text = message
            elif outcome.status in (Status.UNSUPPORTED, Status.NOT_RUN):
                ET.SubElement(case, "skipped", message=f"{outcome.status.value}: {message}"[:500])
            elif outcome.status in (Status.WARN, Status.STRICT):
                # a strict-only finding is not a failure of the rule
                ET.SubElement(case, "system-out").text = f"{outcome.status.value}: {message}"
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
