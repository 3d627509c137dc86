"""Findings in backend terms on every surface, sanitizer findings included: a finding of a sanitizer log
(``fa3verify.sanitize.records.log_to_run_summary``, what ``fa3verify report LOG.jsonl`` renders) carries the
differing FA3 arguments, S_p vs S_c, the call's lengths, the path (eager, or a CUDA graph's replay), the guard's
decision, the configuration of its case file and a fix hint, read from the pair the sanitizer recorded
(``fa3verify.finding_terms``). The FA3 modules are the fakes of tests/sanitize_fakes.py (the worked example at
CPU size: heads (8, 4) precomputed as (2, 1), S_p=7 vs S_c=4)."""

from __future__ import annotations

import json

import pytest
import torch

import fa3verify.sanitize as sanitize
from fa3verify.sanitize.records import log_to_run_summary
from fa3verify.summary import finding_sentence, finding_text, summary_markdown

from sanitize_fakes import fakes  # noqa: F401 - a fixture
from engines.test_sanitize import HEADS, LENS, STALE, install, run_decode, tensors


def in_backend_terms(text: str, path: str) -> bool:
    """Whether a rendered finding names the worked example's terms: the differing heads, the lengths, S_p vs S_c,
    the path, the guard's decision and a fix hint."""
    return all(part in text for part in ("precomputes with heads (2, 1) but calls with heads (8, 4)",
                                         f"({path} path)", "S_p=7 vs S_c=4", "kept the precompute", "fix: "))


def _log_of_a_stale_decode(tmp_path):
    s = install(tmp_path, "record")
    import fake_backend

    run_decode(fake_backend.Backend(STALE))
    log = s.log.path
    sanitize.uninstall()
    return log


def test_a_sanitizer_finding_is_in_backend_terms_on_every_surface(fakes, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_FA3_GPU_LIKE", "1")
    log = _log_of_a_stale_decode(tmp_path)
    data = log_to_run_summary(log)
    (f,) = data["findings"]
    assert f["differs"]["heads"] == [[2, 1], [8, 4]] and (f["s_p"], f["s_c"]) == (7, 4)
    assert f["seq_lens"] == LENS and f["path"] == "eager" and "/tp4/cp4" in f["config"] and f["hint"]
    assert in_backend_terms(finding_text(f), "eager") and in_backend_terms(summary_markdown(data), "eager")
    from fa3verify.html_report import render_html

    assert "precomputes with heads (2, 1) but calls with heads (8, 4)" in render_html(data)
    # negative control: the finding as the log gave it before (no terms) says none of it
    import fa3verify.finding_terms as observed_terms

    monkeypatch.setattr(observed_terms, "sanitizer_terms", lambda line, mode=None: {})
    (bare,) = log_to_run_summary(log)["findings"]
    assert not finding_sentence(bare) and not in_backend_terms(finding_text(bare), "eager")


def test_a_graph_replay_finding_names_the_replay_path(fakes, tmp_path):
    s = install(tmp_path, "record")
    import fake_backend

    s.checker.report_causes = False     # the replay-time check alone (the cause at capture: engines/test_sanitize_causes.py)
    capturing = [False]
    s.checker.capturing = lambda: capturing[0]
    buf = torch.zeros(1 + 4 * 4, dtype=torch.int32)
    q, k, v, pt, cs, cu = tensors()
    ones = torch.ones(4, dtype=torch.int32)
    backend = fake_backend.Backend(STALE)

    def recompute(lens):
        md = backend.metadata(lens, cu, int(lens.max()), 16)
        buf[:md.numel()] = md
        buf[md.numel():] = 0
        return buf[:md.numel()]

    capturing[0] = True
    backend.decode(q, k, v, pt, ones, cu, recompute(ones))       # capture: S_p = 1, nothing to see
    capturing[0] = False
    recompute(cs)                                                 # the stale recompute before the replay
    log = s.log.path
    sanitize.uninstall()
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [x.get("path") for x in lines if x["type"] == "violation"] == ["replay"]
    (f,) = log_to_run_summary(log)["findings"]
    assert f["path"] == "replay" and f["s_c"] == 4 and f["differs"]["heads"] == [[2, 1], [8, 4]]
    assert "(replay path)" in finding_text(f)


@pytest.mark.parametrize("line, want", [
    ({"summary": {"precomputed": False, "precompute": None, "call": {}, "s_p": None, "s_c": 3},
      "violations": [{"invariant": "UNKNOWN_METADATA"}]}, "no recorded precompute"),
    ({"violations": [{"invariant": "UNCHECKED_CALL"}]}, None),
])
def test_a_line_without_a_precompute_has_no_made_up_arguments(line, want):
    from fa3verify.finding_terms import sanitizer_terms

    terms = sanitizer_terms(line)
    assert terms["differs"] == {} and "config" not in terms and terms["hint"]
    assert (want in terms["guard"]) if want else terms["guard"] == ""
