"""The lab's HTML report for real: rendered by a real headless browser (Debian's chromium), which must load every
picture, and drawn from what a real quick lab run wrote, with its explanations of cells that did better than
predicted. Its structure, escaping and schema are in `test_lab_report.py`.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import tempfile
import time
import xml.etree.ElementTree as ET
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fencelock._lab.report import timeline, write_report
from fencelock.testing.timing import slack
from tests.conftest import IN_CI
from tests.lab.lab_sample import sample_results

from . import test_lab_report as _base
from .test_lab_report import (
    CHROMIUM,
    HEIGHT,
    WIDTH,
    _by_id,
    _ev,
    _text,
)

report = _base.report   # the same fixtures, for this module's tests
tree = _base.tree

# --- a real browser ---------------------------------------------------------------------------------------------


def _chromium() -> str:
    if os.access(CHROMIUM, os.X_OK):
        return CHROMIUM
    found = shutil.which("chromium")
    if found:
        return found
    message = "the browser test needs Debian's chromium (apt-get install chromium fonts-dejavu-core)"
    if IN_CI:
        pytest.fail(f"CI must run the browser test: {message}")
    pytest.skip(message)


@pytest.fixture
def browser() -> Iterator[list[str]]:
    """The command line of a headless chromium with its own profile, no network chatter and no sandbox."""
    with tempfile.TemporaryDirectory(prefix="fencelock-chromium-") as profile:
        yield [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               f"--user-data-dir={profile}", f"--window-size={WIDTH},{HEIGHT}"]


def _run(command: list[str]) -> subprocess.CompletedProcess[bytes]:
    done = subprocess.run(command, capture_output=True, timeout=60, check=False, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    return done


def _png(data: bytes) -> tuple[int, int, int, int, bytes]:
    """Width, height, bit depth, colour type and the inflated image data of a PNG, checking every CRC."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, chunks = 8, []
    while pos < len(data):
        (length,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        body, crc = data[pos + 8:pos + 8 + length], data[pos + 8 + length:pos + 12 + length]
        assert struct.unpack(">I", crc)[0] == zlib.crc32(kind + body), f"bad CRC in {kind!r}"
        chunks.append((kind, body))
        pos += 12 + length
    assert chunks[0][0] == b"IHDR"
    assert chunks[-1][0] == b"IEND"
    width, height, depth, colour = struct.unpack(">IIBB", chunks[0][1][:10])
    return width, height, depth, colour, zlib.decompress(b"".join(b for k, b in chunks if k == b"IDAT"))


@pytest.mark.slow
def test_chromium_renders_the_report_and_loads_every_picture(report: Path, browser: list[str],
                                                             tmp_path: Path) -> None:
    from PIL import Image

    url = report.resolve().as_uri()
    shot = tmp_path / "report.png"
    started = time.perf_counter()
    _run([*browser, f"--screenshot={shot}", url])
    # The virtual-time budget lets the page's load handler finish before the DOM is dumped (it returns as soon
    # as the page is idle, not after 5 s).
    dom = _run([*browser, "--dump-dom", "--virtual-time-budget=5000", url]).stdout.decode()
    elapsed = time.perf_counter() - started

    width, height, depth, colour, pixels = _png(shot.read_bytes())
    assert (width, height) == (WIDTH, HEIGHT)
    assert len(pixels) == height * (1 + width * (depth // 8) * {2: 3, 6: 4}[colour])
    with Image.open(shot) as image:
        rgb = image.convert("RGB")
        colours = rgb.getcolors(maxcolors=1 << 20) or []
        # Not blank: text, the header and the verdict matrix's tinted cells are all there.
        assert len(colours) > 200, f"only {len(colours)} colours"
        seen = {c for _, c in colours}
        assert (0xE3, 0xF2, 0xE6) in seen, "no SAFE cell in the screenshot"
        assert (0xFD, 0xE3, 0xE5) in seen, "no UNSAFE cell in the screenshot"
        top_left = rgb.crop((0, 0, WIDTH, 200)).getcolors(maxcolors=1 << 20) or []
        assert len(top_left) > 20, "the header did not render"

    body = dom[dom.index("<body"):dom.index(">", dom.index("<body")) + 1]
    drawn = sum(1 for c in sample_results()["cells"] if c["verdict"] != "SKIPPED") + 1
    assert f'data-pictures-loaded="{drawn}"' in body, body
    assert 'data-pictures-broken="0"' in body, body
    assert dom.count('data-loaded="yes"') == drawn
    assert "data-pwned" not in body                                # the note's script did not run
    assert elapsed < slack(20.0), f"chromium took {elapsed:.1f} s"


def test_a_cell_with_thousands_of_events_draws_quickly_and_lists_the_first_300(tmp_path: Path) -> None:
    results = sample_results()
    events: list[dict[str, Any]] = []
    for i in range(500):                                           # four workers taking turns, 2000 events
        t, worker = i * 0.01, f"w{i % 4}"
        events += [_ev(t, worker, "acquire", i + 1, True, t + 0.008), _ev(t + 0.002, worker, "write", i + 1, True),
                   _ev(t + 0.004, worker, "write", i, i % 50 == 0), _ev(t + 0.006, worker, "release", i + 1, True)]
    results["cells"] = [{**results["cells"][0], "events": events}]
    started = time.perf_counter()
    page = write_report(results, tmp_path)
    elapsed = time.perf_counter() - started
    assert elapsed < slack(15.0), f"{elapsed:.1f} s for one cell of 2000 events"
    figure = _by_id(ET.parse(page).getroot(), "cell-pause-past-ttl--redis")
    assert len(figure.findall(".//table[@class='events']/tbody/tr")) == 300
    assert "and 1700 more events (see results.json)" in _text(figure)


def test_a_skipped_cell_of_an_available_configuration_gives_its_reason_not_an_install_hint(tmp_path: Path) -> None:
    results = sample_results()
    results["cells"] = [c for c in results["cells"] if c["scenario"] == "failover"]
    cell = next(c for c in results["cells"] if c["config"] == "redlock")
    cell.update(verdict="SKIPPED", note="does not apply: Redlock nodes have no replicas", events=[])
    root = ET.parse(write_report(results, tmp_path)).getroot()
    matrix = root.find(".//table[@class='matrix']")
    assert matrix is not None
    td = matrix.findall("tbody/tr")[3].findall("td")[2]
    assert "does not apply: Redlock nodes have no replicas" in _text(td)
    assert "how to add it" not in _text(td)
    assert "Not run" in _text(_by_id(root, "cell-failover--redlock"))


def test_a_pause_then_a_burst_gets_a_zoom_panel_and_an_even_timeline_does_not() -> None:
    from fencelock._lab.report import busy_window

    burst = timeline([_ev(0.0, "a", "acquire", 1, True, 0.4), _ev(0.05, "lab", "fault"),
                      _ev(0.60, "b", "acquire", 2, True, 3.6), _ev(0.61, "b", "write", 2, True),
                      _ev(0.62, "a", "write", 1, True), _ev(0.63, "a", "release", 1, False),
                      _ev(0.64, "b", "release", 2, True)])
    assert burst.t_max == 0.64                                     # b's unused lease end (3.6 s) is not drawn
    window = busy_window(burst)
    assert window is not None
    assert window[0] < 0.60 < 0.64 < window[1] < 0.7
    even = timeline([_ev(t / 10, "a", "write", None, True) for t in range(10)])
    assert busy_window(even) is None


# --- what the lab really writes ---------------------------------------------------------------------------------

REAL = Path(__file__).with_name("lab_results_quick.json")     # what `fencelock lab --quick --seed 7` wrote


@pytest.fixture(scope="module")
def real() -> dict[str, Any]:
    import json

    results: dict[str, Any] = json.loads(REAL.read_text(encoding="utf-8"))
    return results


@pytest.fixture(scope="module")
def real_tree(real: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> ET.Element:
    return ET.parse(write_report(real, tmp_path_factory.mktemp("real"))).getroot()


def test_on_a_real_quick_run_the_pictures_mark_exactly_the_writes_the_lab_checker_counted(
        real: dict[str, Any], real_tree: ET.Element) -> None:
    results = real
    judged = [c for c in results["cells"] if c["verdict"] in ("SAFE", "UNSAFE")]
    assert len(judged) >= 30
    for cell in judged:
        o = timeline(cell["events"]).outcomes()
        where = (cell["scenario"], cell["config"])
        assert o["stale"] == cell["counts"]["stale_accepted"], where
        assert o["rejected"] + o["unanswered"] == cell["counts"]["stale_rejected"], where
    assert len(real_tree.findall(".//figure//img")) == sum(1 for c in results["cells"] if c["verdict"] != "SKIPPED")


def test_scenario_variants_keep_their_letter(real_tree: ET.Element) -> None:
    heads = [_text(h) for h in real_tree.findall(".//section[@class='scenario']/h3")]
    assert [h.split(".")[0] for h in heads] == ["1", "2", "3", "4", "4b", "4c", "4d", "4e", "5a", "5b", "5c", "6", "7",
                                                "8a", "8b", "9"]


# --- where fencelock does better than the literature, and where one of its assumptions ends ------------------


def _explained_results() -> dict[str, Any]:
    """The sample with three explained cells: fencelock better than predicted (SAFE, predicted UNSAFE), the same
    claim not met (UNSAFE), and a cell UNSAFE as predicted because a stated assumption did not hold."""
    results = sample_results()
    cells = {(c["scenario"], c["config"]): c for c in results["cells"]}
    better = cells[("failover", "redis-guard")]
    safe = cells[("pause-past-ttl", "redis-guard")]
    better.update(verdict="SAFE", expected="UNSAFE", matches_expectation=True, counts=dict(safe["counts"]),
                  events=list(safe["events"]), beyond="the promoted replica's fence follows its clock <above A's>")
    missed = cells[("restart-no-fsync", "redlock-guard")]
    missed.update(verdict="UNSAFE", expected="UNSAFE", matches_expectation=False,
                  beyond="the restarted node takes a fence floor from its clock")
    edge = cells[("clock-jump", "redis-guard")]
    unsafe = cells[("pause-past-ttl", "redis")]
    edge.update(verdict="UNSAFE", expected="UNSAFE", matches_expectation=True, counts=dict(unsafe["counts"]),
                events=list(unsafe["events"]), boundary="the new server's clock is 30 s behind the old one's")
    return results


def test_the_report_explains_where_fencelock_does_better_than_predicted_instead_of_flagging_it(
        tmp_path: Path) -> None:
    """Issue 16: a cell SAFE where the literature predicts UNSAFE says why, is not counted as agreeing with the
    literature nor as differing; a cell at the edge of an assumption says which; a claim not met is flagged."""
    tree = ET.parse(write_report(_explained_results(), tmp_path)).getroot()
    summary = _text(_by_id(tree, "verdicts").find("p"))      # type: ignore[arg-type]
    assert "Of the 42 with a verdict, 39 agree with the literature, 1 do better than it predicts" in summary
    assert "and 2 differ" in summary

    assert _text(_by_id(tree, "better")) == "Where fencelock does better than the literature predicts"
    (item,) = [li for li in tree.iter("li") if "Scenario 4 on single Redis + guard" in _text(li)]
    text = _text(item)
    assert "SAFE, where Redis docs, Distributed Locks with Redis (replication) predicts UNSAFE" in text
    assert "Why: the promoted replica's fence follows its clock <above A's>." in text  # escaped, as text

    (edge,) = [li for li in tree.iter("li") if "Scenario 6 on single Redis + guard" in _text(li)]
    assert "UNSAFE, where Kleppmann 2016, How to do distributed locking; antirez 2016, Is Redlock safe? predicts " \
           "UNSAFE. Why: the new server's clock is 30 s behind the old one's." in _text(edge)
    assert "a stated assumption does not" in _text(_by_id(tree, "boundary"))

    shown = " | ".join(_text(td) for td in tree.iter("td"))
    assert "better than predicted (UNSAFE): the promoted replica's fence follows its clock <above A's>." in shown
    assert "= as predicted (UNSAFE), at the edge of an assumption: the new server's clock is 30 s behind" in shown
    assert "≠ predicted SAFE, where fencelock should do better than the UNSAFE the literature predicted" in shown
    differences = _text(_by_id(tree, "differences"))
    assert differences.startswith("Where this run differs from the prediction")
    flagged = [li for li in tree.iter("li") if "Scenario 5 on Redlock + fencing guard" in _text(li)]
    assert any("should be SAFE although" in _text(li) for li in flagged)


def test_the_printed_table_marks_better_cells_with_a_plus_and_says_why() -> None:
    from fencelock._lab.table import table

    printed = table(_explained_results(), width=200)
    assert "+: better than the literature predicts" in printed
    assert "failover x redis-guard: predicted UNSAFE, SAFE: the promoted replica's fence follows its clock" in printed
    assert "clock-jump x redis-guard: UNSAFE: the new server's clock is 30 s behind" in printed
    assert "restart-no-fsync x redlock-guard: expected SAFE (the literature: UNSAFE; the restarted node" in printed
    line = next(x for x in printed.splitlines() if x.startswith("failover  "))
    assert "SAFE +" in line
