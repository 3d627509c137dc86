"""The verdict table of a run as the command line prints it (check, kind, verdict, seconds, case file or note), in
the form that fits where it goes:

* a terminal at least :data:`TABLE_MIN_WIDTH` columns wide: a table whose check and note columns share the width;
  check names and case files wrap (fold) instead of being cut, so each is whole; a note that is a message shows its
  first line, on one line, cut with an ellipsis (the log form, the JSON and the findings below have all of it);
* a narrower terminal: a list, one row per check (verdict, seconds, kind, name) with its case file (whole) or the
  first line of its message (at most :data:`LIST_NOTE_LINES` lines) indented below, wrapped to the width;
* anything else (a CI log, a pipe, a file): plain lines with no box drawing and nothing cut or wrapped, the whole
  note (every line of it) and the case file on lines of their own, so a log viewer wraps them and ``grep`` finds
  them.

Then, in every form, the reach of a campaign that drew from (or checked its draws against) a system's own domain
(``RunSummary.domain``: cases per metadata path, paths not covered and why, configurations drawn and rejected),
which the JSON report also carries, and the one-line verdict (:func:`fa3verify.summary.verdict_line`).
"""

from __future__ import annotations

from typing import Optional

#: Terminal width (columns) from which the table form is used; below it, the list form.
TABLE_MIN_WIDTH = 120
#: Lines a message note takes at most in the list form (a case file is never cut).
LIST_NOTE_LINES = 2


def _style(check) -> str:
    return "red" if check.failed else ("yellow" if check.inconclusive else "green")


def _note(check) -> str:
    """The note column of a terminal form: the case file, else the message's first line."""
    if check.case_file:
        return check.case_file
    return check.message.splitlines()[0] if check.message else ""


def _note_text(check, max_chars: Optional[int] = None):
    """The note as rich Text: a case file folds (whole, over as many lines as it needs); a message is cut with an
    ellipsis, to ``max_chars`` characters or (without it) to the one line of its cell."""
    from rich.text import Text

    note = _note(check)
    if check.case_file:
        return Text(note, overflow="fold")
    if max_chars is not None and len(note) > max_chars:
        note = note[:max_chars - 1] + "\u2026"
    return Text(note, overflow="fold") if max_chars is not None else Text(note, overflow="ellipsis", no_wrap=True)


def form_for(console) -> str:
    """"table", "list" or "plain" for this console (see the module docstring)."""
    if not console.is_terminal:
        return "plain"
    return "table" if console.width >= TABLE_MIN_WIDTH else "list"


def print_table(summary, console=None) -> None:
    """Print the verdict table of ``summary`` (a RunSummary) in the form that fits ``console`` (default: one on
    stdout), its domain's reach when it has one, and the one-line verdict."""
    from rich.console import Console

    from .summary import verdict_line

    if console is None:
        console = Console()
    form = form_for(console)
    if form == "plain":
        _print_plain(summary, console)
    elif form == "table":
        _print_wide(summary, console)
    else:
        _print_list(summary, console)
    for line in reach_lines(getattr(summary, "domain", None)):
        _out(console, line, plain=form == "plain")
    _out(console, verdict_line(summary), plain=form == "plain")


def _out(console, text: str, plain: bool) -> None:
    """One line: on a log written as is (no markup, no wrapping, nothing cut), on a terminal wrapped to the width."""
    if plain:
        console.file.write(text + "\n")
        console.file.flush()
    else:
        console.print(text, markup=False, highlight=False, overflow="fold")


def _print_wide(summary, console) -> None:
    from rich.markup import escape
    from rich.table import Table

    from .summary import verdict_label

    table = Table(title=f"fa3verify {summary.command}", expand=True)
    # the check column as wide as its longest name, up to 3/5 of what the fixed columns (46) leave and never so
    # wide that the note gets under 40; the note the rest
    room = console.width - 46
    table.add_column("check", overflow="fold", max_width=max(24, min(room * 3 // 5, room - 40)))
    table.add_column("kind", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    table.add_column("seconds", justify="right", no_wrap=True)
    table.add_column("case file / note", ratio=1, min_width=30, overflow="fold")
    for c in summary.checks:
        style = _style(c)
        table.add_row(escape(c.name), c.kind, f"[{style}]{escape(verdict_label(c))}[/{style}]", f"{c.seconds:.2f}",
                      _note_text(c))
    console.print(table)


def _print_list(summary, console) -> None:
    from rich.markup import escape
    from rich.padding import Padding
    from rich.text import Text

    from .summary import verdict_label

    console.print(Text(f"fa3verify {summary.command}: {len(summary.checks)} checks", style="bold"))
    for c in summary.checks:
        style = _style(c)
        console.print(f"[{style}]{escape(verdict_label(c))}[/{style}] {c.seconds:.2f}s {c.kind}: {escape(c.name)}",
                      highlight=False, overflow="fold")
        if _note(c):
            room = max(20, console.width - 4) * LIST_NOTE_LINES
            console.print(Padding(_note_text(c, room), (0, 0, 0, 4)))


def _print_plain(summary, console) -> None:
    from .summary import verdict_label

    lines = [f"fa3verify {summary.command}: {len(summary.checks)} checks"]
    for c in summary.checks:
        lines.append(f"  {verdict_label(c)} {c.seconds:.2f}s {c.kind}: {c.name}")
        for text in (c.message or "").splitlines():
            lines.append(f"      {text}")
        if c.case_file:
            lines.append(f"      case file: {c.case_file}")
    console.file.write("\n".join(lines) + "\n")
    console.file.flush()


def reach_lines(domain: Optional[dict]) -> list:
    """The reach of a campaign on a system's own domain, in lines (none without a domain report): cases that
    consumed precomputed metadata on each path and layer type, the paths no case covered and why, and the
    configurations drawn and rejected by the system's own reasons."""
    if not domain:
        return []
    reach = domain.get("reach") or {}
    paths = {k: n for k, n in reach.items() if not k.startswith("layer:")}
    layers = {k[len("layer:"):]: n for k, n in reach.items() if k.startswith("layer:")}
    lines = ["reach (cases per metadata path): " + ", ".join(f"{path} {n}" for path, n in paths.items())]
    if layers:
        lines.append("reach (cases per layer type): " + ", ".join(f"{kind} {n}" for kind, n in layers.items()))
    for path, why in (domain.get("not_covered") or {}).items():
        lines.append(f"  not covered: {path}: {why}")
    rejected = domain.get("rejected") or {}
    drawn = domain.get("drawn")
    if drawn is not None:
        top = "; ".join(f"{n}x {reason}" for reason, n in rejected.items())
        lines.append(f"domain {domain.get('name', '?')}: {drawn} configurations drawn, {domain.get('accepted', 0)} "
                     f"accepted, {sum(rejected.values())} rejected by the system" + (f" ({top})" if top else ""))
    return lines
