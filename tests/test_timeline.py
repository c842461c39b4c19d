"""Timeline spans, idle fractions by hand, and `schedrl report`."""

from __future__ import annotations

import pytest

from schedrl.cli import main
from schedrl.gantt import write_report
from schedrl.timeline import TIMELINE_FILE, Recorder, Span, append_spans, busy_fractions, read_spans


def test_recorder_merges_touching_spans_of_one_kind():
    r = Recorder("engine")
    r.add("decode", 0.0, 1.0)
    r.add("decode", 1.0005, 2.0)  # within the merge gap
    r.add("prefill", 2.0, 2.5)
    r.add("decode", 3.0, 4.0)  # a gap: a new span
    assert [(s.kind, s.start, s.end) for s in r.drain()] == [
        ("decode", 0.0, 2.0),
        ("prefill", 2.0, 2.5),
        ("decode", 3.0, 4.0),
    ]
    assert r.drain() == []
    with pytest.raises(ValueError, match="unknown span kind 'nap'"):
        r.add("nap", 0, 1)


def test_idle_fractions_by_hand():
    spans = [
        Span("engine", "decode", 0.0, 4.0),
        Span("engine", "weight-sync", 6.0, 7.0),
        Span("learner", "train", 2.0, 6.0),
        Span("learner", "weight-sync", 5.0, 8.0),  # overlap counted once
        Span("learner", "wait", 0.0, 2.0),
    ]
    f = busy_fractions(spans)  # the window is 0..8 s
    assert f["engine"]["busy_s"] == pytest.approx(5.0) and f["engine"]["idle_frac"] == pytest.approx(3 / 8)
    assert f["learner"]["busy_s"] == pytest.approx(6.0) and f["learner"]["idle_frac"] == pytest.approx(2 / 8)
    assert f["learner"]["train"] == pytest.approx(4.0)
    # idle while active: the engine's own window is 0..7 s (busy 5), the learner's 2..8 s (busy 6)
    assert f["engine"]["active_idle_frac"] == pytest.approx(2 / 7)
    assert f["learner"]["active_idle_frac"] == pytest.approx(0.0)


def test_report_writes_png_and_html(tmp_path, capsys):
    append_spans(
        tmp_path / TIMELINE_FILE, [Span("engine", "decode", 10.0, 11.0), Span("learner", "train", 10.5, 12)]
    )
    assert read_spans(tmp_path / TIMELINE_FILE)[1].kind == "train"
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "engine" in out and "50.0%" in out and "learner" in out
    html = (tmp_path / "timeline.html").read_text()
    assert html.count("<svg") == 1 and "<script src" not in html and "decode" in html
    assert (tmp_path / "timeline.png").read_bytes()[:4] == b"\x89PNG"


def test_report_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="timeline.jsonl"):
        write_report(tmp_path)
    (tmp_path / TIMELINE_FILE).write_text(
        '{"worker": "e", "kind": "decode", "start": 0, "end": 1}\nnot json\n'
    )
    with pytest.raises(ValueError, match=r"timeline.jsonl:2"):
        write_report(tmp_path)
