"""The lab's HTML report: well-formed, one picture per cell, verdicts and counts shown, every string escaped (the
real browser and a real run's results are in `test_lab_report_real.py`)."""

from __future__ import annotations

import base64
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from fencelock._lab.report import check_results, timeline, write_report
from tests.lab.lab_sample import SCRIPT_NOTE, sample_results

CHROMIUM = "/usr/bin/chromium"
WIDTH, HEIGHT = 1400, 2000


TIMES: dict[str, float] = {}


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    started = time.perf_counter()
    path = write_report(sample_results(), tmp_path_factory.mktemp("report"))
    TIMES["sample"] = time.perf_counter() - started
    return path


@pytest.fixture(scope="module")
def tree(report: Path) -> ET.Element:
    return ET.parse(report).getroot()       # the page is polyglot XHTML: a strict XML parser must accept it


def _text(element: ET.Element) -> str:
    return " ".join(" ".join(element.itertext()).split())


def _by_id(tree: ET.Element, anchor: str) -> ET.Element:
    found = tree.find(f".//*[@id='{anchor}']")
    assert found is not None, anchor
    return found


def _anchor(cell: dict[str, Any]) -> str:
    return f"cell-{cell['scenario']}--{cell['config']}"


# --- the timeline model (pure) --------------------------------------------------------------------------------


def test_the_timeline_marks_the_same_stale_writes_the_lab_counted() -> None:
    for cell in sample_results()["cells"]:
        if cell["verdict"] in ("SAFE", "UNSAFE"):
            tl = timeline(cell["events"])
            assert tl.outcomes()["stale"] == cell["counts"]["stale_accepted"], (cell["scenario"], cell["config"])
            assert tl.outcomes()["rejected"] == cell["counts"]["stale_rejected"], (cell["scenario"], cell["config"])
            assert len(tl.faults) == cell["counts"]["faults"]


def _ev(t: float, worker: str, kind: str, fence: int | None = None, ok: bool | None = None,
        lease_end: float | None = None) -> dict[str, Any]:
    return {"t": t, "worker": worker, "kind": kind, "fence": fence, "ok": ok, "lease_end": lease_end, "detail": ""}


def test_a_paused_holder_is_drawn_past_its_lease_end_and_its_late_write_is_stale() -> None:
    tl = timeline([
        _ev(0.0, "a", "acquire", 1, True, 1.0), _ev(0.2, "lab", "fault"), _ev(1.1, "b", "acquire", 2, True, 2.1),
        _ev(1.2, "b", "write", 2, True), _ev(1.5, "a", "write", 1, True), _ev(1.6, "b", "release", 2, True),
        _ev(1.7, "a", "release", 1, False),
    ])
    assert tl.lanes == ["a", "b"]                                  # "lab" only injected a fault: no lane
    a, b = tl.leases
    assert (a.start, a.valid_until, a.held_until, a.past_end, a.ending) == (0.0, 1.0, 1.7, True, "release refused")
    assert (b.past_end, b.ending) == (False, "released")
    assert [w.outcome for w in tl.writes] == ["accepted", "stale"]
    assert tl.overlaps == [(1.1, 1.6)]
    assert [m.label for m in tl.faults] == ["F1"]


def test_a_lower_fence_after_a_higher_one_is_stale_even_inside_a_valid_lease() -> None:
    tl = timeline([_ev(0.0, "a", "acquire", 5, True, 9.0), _ev(0.1, "b", "acquire", 6, True, 9.0),
                   _ev(0.2, "b", "write", 6, True), _ev(0.3, "a", "write", 5, True), _ev(0.4, "a", "write", 5, False)])
    assert [w.outcome for w in tl.writes] == ["accepted", "stale", "rejected"]


def test_an_extension_moves_the_lease_end_and_only_a_later_grant_makes_a_late_write_stale() -> None:
    alone = [_ev(0.0, "a", "acquire", None, True, 1.0), _ev(0.5, "a", "acquire", None, True, 2.0),
             _ev(1.5, "a", "write", None, True), _ev(1.6, "a", "release", None, True),
             _ev(1.8, "a", "write", None, True), _ev(1.9, "a", "write", None, None)]
    tl = timeline(alone)
    (lease,) = tl.leases
    assert (lease.extensions, lease.valid_until, lease.past_end) == (1, 2.0, False)
    # Nobody else held the lock, so by the lab's rules the late write harmed no one.
    assert [w.outcome for w in tl.writes] == ["accepted", "accepted", "unanswered"]
    tl = timeline([*alone[:4], _ev(1.7, "b", "acquire", None, True, 3.0), _ev(1.75, "b", "write", None, True),
                   *alone[4:]])
    assert [w.outcome for w in tl.writes] == ["accepted", "accepted", "stale", "unanswered"]


def test_an_expiry_ends_validity_and_a_lease_never_released_stays_open_to_its_end() -> None:
    events = [_ev(0.0, "a", "acquire", 1, True, 3.0), _ev(0.5, "a", "expire", 1), _ev(0.8, "a", "write", 1, True)]
    (lease,) = timeline(events).leases
    assert (lease.valid_until, lease.held_until, lease.ending, lease.past_end) == (0.5, 3.0, "open", True)
    granted = [*events[:2], _ev(0.6, "b", "acquire", 2, True, 3.0)]
    assert timeline([*granted, events[2]]).writes[0].outcome == "accepted"  # before b's first access: ordered first
    late = timeline([*granted, _ev(0.7, "b", "read", 2, True), events[2]])
    assert late.writes[0].outcome == "stale"                      # after the resource served b (a read is enough)


def test_equal_fences_from_a_failed_over_counter_are_caught_by_the_grant_order() -> None:
    tl = timeline([_ev(0.0, "a", "acquire", 2, True, 3.0), _ev(0.1, "b", "acquire", 2, True, 3.0),
                   _ev(0.2, "b", "write", 2, True), _ev(0.3, "a", "write", 2, True)])
    assert [w.outcome for w in tl.writes] == ["accepted", "stale"]


def test_a_write_belongs_to_the_lease_it_was_sent_under() -> None:
    # Sent at 0.4 under a's lease, decided at 1.5 after b's write: stale, though a held nothing when it arrived.
    write = {**_ev(1.5, "a", "write", 1, True), "sent": 0.4}
    tl = timeline([_ev(0.0, "a", "acquire", 1, True, 1.0), _ev(0.45, "a", "release", 1, True),
                   _ev(0.5, "b", "acquire", 2, True, 1.5), _ev(0.6, "b", "write", 2, True), write])
    assert [w.outcome for w in tl.writes] == ["accepted", "stale"]
    assert tl.writes[1].t == 1.5                                   # drawn when the resource decided


# --- checking the input -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("change", "error", "message"), [
    (lambda r: r.update(version=2), ValueError, "version 2 is not supported"),
    (lambda r: r.pop("seed"), ValueError, "results has no 'seed'"),
    (lambda r: r.update(seed=True), TypeError, "results['seed'] must be int, got bool"),
    (lambda r: r["cells"][3].update(verdict="MAYBE"), ValueError, "cells[3]['verdict'] is 'MAYBE'"),
    (lambda r: r["cells"][0]["counts"].pop("writes"), ValueError, "cells[0]['counts'] has no 'writes'"),
    (lambda r: r["cells"][0]["events"][0].update(t=float("nan")), ValueError, "['events'][0]['t'] must be finite"),
    (lambda r: r["cells"][0]["events"][1].update(kind="teleport"), ValueError, "['events'][1]['kind']"),
    (lambda r: r["configs"].__setitem__(0, "redis"), TypeError, "configs[0] must be a dict"),
])
def test_results_that_break_the_schema_are_refused_by_name_and_nothing_is_written(
        tmp_path: Path, change: Any, error: type[Exception], message: str) -> None:
    results = sample_results()
    change(results)
    with pytest.raises(error) as raised:
        write_report(results, tmp_path / "out")
    assert message in str(raised.value)
    assert not (tmp_path / "out").exists()


def test_the_sample_follows_the_schema() -> None:
    check_results(sample_results())


def test_the_report_needs_no_plotting_library(tmp_path: Path) -> None:
    # The report draws plain SVG: it must not need matplotlib, numpy or pillow.
    code = ("import sys\nfor name in ('matplotlib', 'numpy', 'PIL'): sys.modules[name] = None\n"
            "from pathlib import Path\nfrom tests.lab.lab_sample import sample_results\n"
            "from fencelock._lab.report import write_report\n"
            f"print(write_report(sample_results(), Path({str(tmp_path / 'out')!r})))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "out" / "index.html").read_text(encoding="utf-8")
    drawn = sum(1 for c in sample_results()["cells"] if c["verdict"] != "SKIPPED")
    assert page.count('src="data:image/svg+xml;base64,') == drawn + 1          # every cell, and the legend


# --- the page ---------------------------------------------------------------------------------------------------

VOID = {"meta", "img", "br", "col", "link", "input", "hr", "wbr", "source"}
# Elements an HTML parser would not keep inside a <p> (it closes the <p> first, and the page means something else).
BLOCK = {"div", "ul", "ol", "table", "figure", "section", "details", "dl", "h1", "h2", "h3", "h4", "p", "header",
         "main", "footer"}


class _StrictHTML(HTMLParser):
    """Balanced tags as a browser reads them: every end tag closes the innermost open element, and no block
    element opens inside a <p>."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.problems: list[str] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in BLOCK and "p" in self.stack:
            self.problems.append(f"<{tag}> inside <p> at {self.getpos()}")
        if tag == "script":
            self._in_script = True
            self.scripts.append("")
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in VOID:
            self.problems.append(f"<{tag}/> is not a void element at {self.getpos()}")

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'} at {self.getpos()}")
        else:
            self.stack.pop()

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.scripts[-1] += data


def test_the_page_is_well_formed_as_html_and_as_xml(report: Path, tree: ET.Element) -> None:
    parser = _StrictHTML()
    parser.feed(report.read_text(encoding="utf-8"))
    parser.close()
    assert parser.problems == []
    assert parser.stack == []
    assert len(parser.scripts) == 1                               # ours, and nothing from the results
    assert tree.tag == "html"
    assert tree.get("lang") == "en"


def test_one_picture_per_cell_each_a_valid_svg_with_a_text_alternative(tree: ET.Element) -> None:
    cells = sample_results()["cells"]
    drawn = [c for c in cells if c["verdict"] != "SKIPPED"]
    for cell in cells:
        if cell["verdict"] == "SKIPPED":                           # ZooKeeper, not installed: said once
            assert tree.find(f".//*[@id='{_anchor(cell)}']") is None
            scenario = _by_id(tree, f"scenario-{cell['scenario']}")
            assert "Not run here: ZooKeeper + guard (see Configurations not run" in _text(scenario)
            continue
        figure = _by_id(tree, _anchor(cell))
        pictures = figure.findall(".//img")
        (img,) = pictures
        src = img.get("src", "")
        assert src.startswith("data:image/svg+xml;base64,")
        svg = ET.fromstring(base64.b64decode(src.split(",", 1)[1]))
        assert svg.tag == "{http://www.w3.org/2000/svg}svg"
        assert "Timeline of scenario" in img.get("alt", "")
        described = _by_id(tree, img.get("aria-describedby", ""))
        assert len(described.findall("li")) >= 1
        assert len(figure.findall(".//table[@class='events']/tbody/tr")) == len(cell["events"])
    assert len(tree.findall(".//figure[@class='timeline']//img")) + len(
        tree.findall(".//figure[@class='timeline differs']//img")) == len(drawn)
    assert len(tree.findall(".//img")) == len(drawn) + 1             # and the legend
    zoomed = [img for img in tree.findall(".//figure//img") if "The lower panel zooms on" in img.get("alt", "")]
    assert len(zoomed) == 5                                          # scenario 2's burst, on each configuration


SVG = "{http://www.w3.org/2000/svg}"


def test_each_picture_draws_its_timeline_bars_marks_faults_and_labels(tree: ET.Element) -> None:
    for cell in sample_results()["cells"]:
        if cell["verdict"] == "SKIPPED":
            continue
        (img,) = _by_id(tree, _anchor(cell)).findall(".//img")
        svg = ET.fromstring(base64.b64decode(img.get("src", "").split(",", 1)[1]))
        panels = 2 if "The lower panel zooms on" in img.get("alt", "") else 1

        def drawn(kind: str, svg: ET.Element = svg) -> int:
            return sum(1 for e in svg.iter() if e.get("class") == kind)

        tl, where = timeline(cell["events"]), (cell["scenario"], cell["config"])
        texts = [e.text or "" for e in svg.iter(f"{SVG}text")]
        for outcome, n in tl.outcomes().items():                   # the zoom panel repeats what falls in it
            assert n <= drawn(outcome) <= n * panels, (where, outcome)
        assert len(tl.leases) <= drawn("lease") <= len(tl.leases) * panels, where
        past = sum(1 for x in tl.leases if x.past_end)
        assert past <= drawn("past-end") <= past * panels, where
        assert len(tl.faults) <= drawn("fault") <= len(tl.faults) * panels, where
        assert len(tl.overlaps) <= drawn("overlap") <= len(tl.overlaps) * panels, where
        assert ("STALE" in texts) is (tl.outcomes()["stale"] > 0), where
        if tl.faults:
            assert any(t.startswith("F1") for t in texts), where
        for worker in tl.lanes:                                    # the lane labels, escaped and shortened
            assert worker[:13] in " ".join(texts), where
        if tl.overlaps:
            assert "overlap" in texts, where


def test_the_matrix_shows_every_verdict_with_its_counts_and_expectation(tree: ET.Element) -> None:
    results = sample_results()
    matrix = tree.find(".//table[@class='matrix']")
    assert matrix is not None
    headers = [_text(th) for th in matrix.findall("thead/tr/th")][1:]
    assert headers == [c["title"] for c in results["configs"]]
    rows = matrix.findall("tbody/tr")
    assert len(rows) == len(results["scenarios"])
    cells = {(c["scenario"], c["config"]): c for c in results["cells"]}
    for scenario, row in zip(results["scenarios"], rows, strict=False):
        head = _text(row.find("th"))   # type: ignore[arg-type]
        assert scenario["title"] in head
        assert f"Source: {scenario['source']}" in head
        for config, td in zip(results["configs"], row.findall("td"), strict=False):
            cell, shown = cells[(scenario["id"], config["id"])], _text(td)
            assert cell["verdict"] in shown
            assert f"predicted{':' if cell['verdict'] not in ('SAFE', 'UNSAFE') else ''} {cell['expected']}" \
                in shown.replace("(", "").replace(")", "")
            if cell["verdict"] in ("SAFE", "UNSAFE"):
                n = cell["counts"]
                assert f"{n['stale_accepted']} stale write" in shown
                assert f"{n['stale_rejected']} rejected" in shown
                assert f"{n['overlaps']} overlap" in shown
                assert f"{n['lost_updates']} lost update" in shown
                differs = not cell["matches_expectation"]
                assert ("≠ predicted" in shown) is differs
                assert ("differs" in td.get("class", "")) is differs
    summary = _text(_by_id(tree, "verdicts"))
    assert "54 cells: 25 SAFE, 17 UNSAFE, 1 FAULT-MISSED, 9 SKIPPED, 2 ERROR" in summary
    assert "41 agree with the literature and 1 differ" in summary


def test_the_header_says_how_the_run_was_made_and_how_to_repeat_it(tree: ET.Element) -> None:
    header = _text(tree.find(".//header"))   # type: ignore[arg-type]
    for part in ("Seed 20261201", "Mode quick", "Started 2026-12-01T06:31:07Z", "Duration 97.4 s",
                 "fencelock lab --quick --seed 20261201 --repeat 3 --out DIR"):
        assert part in header


def test_unavailable_configurations_say_why_and_how_to_add_them(tree: ET.Element) -> None:
    section = _text(_by_id(tree, "unavailable"))
    assert "ZooKeeper + guard" in section
    assert "ZooKeeper is not installed: /usr/share/java/zookeeper.jar not found" in section
    assert "apt-get install zookeeper" in section
    assert "etcd + guard" not in section


def test_strings_from_the_results_are_escaped_everywhere(report: Path, tree: ET.Element) -> None:
    raw = report.read_text(encoding="utf-8")
    assert SCRIPT_NOTE not in raw
    assert "<b>bold?</b>" not in raw
    assert "w1 <async>" not in raw
    assert tree.findall(".//b") == []
    scripts = tree.findall(".//script")
    assert len(scripts) == 1
    assert "pwned" not in (scripts[0].text or "")
    text = _text(tree)
    assert SCRIPT_NOTE in text                                      # shown as text, to be read
    assert "w1 <async>" in text
    assert "<b>bold?</b> & friends" in text


def test_the_same_results_give_the_same_bytes(tmp_path: Path) -> None:
    results = sample_results()
    results["cells"] = results["cells"][:4]
    first = write_report(results, tmp_path / "a").read_bytes()
    assert write_report(results, tmp_path / "b").read_bytes() == first


def test_dozens_of_cells_take_seconds(report: Path) -> None:
    # A generous bound (the machine may be loaded) that still catches a renderer taking a second a picture.
    assert TIMES["sample"] < 20, f"{TIMES['sample']:.1f} s for 54 cells"
