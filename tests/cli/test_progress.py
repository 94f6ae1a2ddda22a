"""The progress line of funnel_cli.output.Progress, drawn on a fake terminal:
a bar when the total is known, a count when it is not, nothing when standard
error is not a terminal."""

from __future__ import annotations

import io
import re

from funnel_cli.output import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def last_line(out: io.StringIO) -> str:
    return out.getvalue().rsplit("\r", 1)[1]


def test_a_known_total_draws_a_bar_and_finish_shows_it_done():
    out = Terminal()
    progress = Progress("importing t.jsonl", 200, out)
    progress.update(50)
    assert re.fullmatch(r"importing t\.jsonl \[#{7}\.{23}\]  25% \d+\.\d s", last_line(out))
    progress.update(100)  # within a tenth of a second of the last: not redrawn
    assert out.getvalue().count("\r") == 1
    progress.finish()
    assert re.fullmatch(r"importing t\.jsonl \[#{30}\] 100% \d+\.\d s\n", last_line(out))


def test_an_unknown_total_draws_a_count_and_stop_ends_the_line_where_it_is():
    out = Terminal()
    progress = Progress("exporting t-1", None, out, unit="events")
    progress.update(3)
    assert re.fullmatch(r"exporting t-1 3 events \d+\.\d s", last_line(out))
    progress.update(1234)
    progress.stop()
    assert re.fullmatch(r"exporting t-1 1234 events \d+\.\d s\n", last_line(out))


def test_a_bar_stopped_after_a_failure_stays_where_it_was():
    out = Terminal()
    progress = Progress("importing t.jsonl", 100, out)
    progress.update(40)
    progress.stop()
    assert last_line(out).startswith(f"importing t.jsonl [{'#' * 12}{'.' * 18}]  40% ")


def test_nothing_is_drawn_when_standard_error_is_not_a_terminal():
    out = io.StringIO()
    for total in (100, None):
        progress = Progress("quiet", total, out)
        progress.update(100)
        progress.finish()
    assert out.getvalue() == ""
