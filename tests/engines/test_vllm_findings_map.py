"""docs/engines-vllm.md: every failing family of the measured vLLM matrix maps to a named finding.

The per-family table of "Every release, measured" (family, path, invariants, found on, first passing release) is
followed by a mapping table (family, path, found on -> finding). Checked here: every family row of the measured table
has its mapping row (same family, path and "found on") and no mapping row is left over; each finding named is a row
of the findings table of "Findings, for vLLM's maintainers" and has its paragraph there (``**N. ...``). Negative
controls: a mapping with one family row dropped, and one naming a finding that has no paragraph, are each reported.
"""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "engines-vllm.md"
MEASURED = "| family (vLLM configuration) | path | invariants | found on | first release where it passes |"
MAPPING = "| family (vLLM configuration) | path | found on | finding | note |"
FINDINGS = "## Findings, for vLLM's maintainers"


def _table(text: str, header: str) -> list[list[str]]:
    lines = text.split("\n")
    start = lines.index(header)
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def _findings(text: str) -> tuple[set, set]:
    """(the findings table's numbers, the numbers with a ``**N. `` paragraph) in the maintainers' section."""
    section = text[text.index(FINDINGS):]
    section = section[:section.index("\n## ", 1)]
    table = {m.group(1) for m in re.finditer(r"^\| (\d+)\. ", section, re.M)}
    paragraphs = {m.group(1) for m in re.finditer(r"^\*\*(\d+)\. ", section, re.M)}
    return table, paragraphs


def unmapped(text: str) -> list[str]:
    """What the mapping misses or names wrongly (empty: every measured family maps to a finding with a paragraph)."""
    measured = {(r[0], r[1], r[3]) for r in _table(text, MEASURED)}
    mapping = {(r[0], r[1], r[2]): r[3] for r in _table(text, MAPPING)}
    table, paragraphs = _findings(text)
    out = [f"no mapping row for {key}" for key in sorted(measured - set(mapping))]
    out += [f"mapping row for a family not in the measured table: {key}" for key in sorted(set(mapping) - measured)]
    for key, finding in sorted(mapping.items()):
        if finding not in table or finding not in paragraphs:
            out.append(f"{key} maps to finding {finding!r}, which has no row and paragraph in {FINDINGS!r}")
    return out


def test_every_measured_family_maps_to_a_finding_with_its_paragraph():
    text = DOC.read_text()
    assert len(_table(text, MEASURED)) >= 39   # the measured table as written at commit 4a3b551 (43 families)
    assert unmapped(text) == []


def test_negative_control_a_dropped_mapping_row_is_reported():
    text = DOC.read_text()
    row = next(line for line in text.split("\n")[text.split("\n").index(MAPPING) + 2:] if line.startswith("| "))
    found = unmapped(text.replace(row + "\n", "", 1))
    assert len(found) == 1 and found[0].startswith("no mapping row for")


def test_negative_control_a_finding_without_a_paragraph_is_reported():
    text = DOC.read_text()
    lines = text.split("\n")
    i = lines.index(MAPPING) + 2
    cells = lines[i].split(" | ")
    cells[3] = "99"
    lines[i] = " | ".join(cells)
    found = unmapped("\n".join(lines))
    assert len(found) == 1 and "finding '99'" in found[0]
