"""The report's HTML page: header, verdict matrix, configurations not run, and one figure per cell."""

from __future__ import annotations

import base64
import hashlib
import html
import re
from collections.abc import Mapping, Sequence
from typing import Any

from . import svg
from .timeline import timeline
from .words import (
    alt_text,
    counts_line,
    describe,
    expectation,
    other_counts,
    plural,
    scenario_label,
    secs,
    sentence,
    short,
    stale_line,
)

VERDICTS = ("SAFE", "UNSAFE", "FAULT-MISSED", "SKIPPED", "ERROR")


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-") or "x"


# Each verdict has its own symbol and word, not only its colour (the en dash marks SKIPPED).
SYMBOL = {"SAFE": "✓", "UNSAFE": "✗", "FAULT-MISSED": "?", "SKIPPED": "\u2013", "ERROR": "!"}
CLASS = {"SAFE": "safe", "UNSAFE": "unsafe", "FAULT-MISSED": "missed", "SKIPPED": "skipped", "ERROR": "error"}
MEANING = {
    "SAFE": "no stale write was accepted in any run",
    "UNSAFE": "a stale write was accepted",
    "FAULT-MISSED": "the fault could not be shown to have happened: no verdict",
    "SKIPPED": "not run (the configuration is not available here)",
    "ERROR": "the cell failed to run: no verdict",
}

HOW_TO_ADD = [
    ("etcd", "Install etcd 3.4 or later so that <code>etcd</code> is on <code>PATH</code> (Debian: "
             "<code>apt-get install etcd-server etcd-client</code>), then run the lab again."),
    ("zk", "Install ZooKeeper 3.8 and Java 17 (Debian: <code>apt-get install zookeeper</code>), then run the lab "
           "again."),
    ("zoo", "Install ZooKeeper 3.8 and Java 17 (Debian: <code>apt-get install zookeeper</code>), then run the lab "
            "again."),
    ("red", "Install <code>redis-server</code> (Debian: <code>apt-get install redis-server</code>) or the embedded "
            "server (<code>pip install 'fencelock[embedded]'</code>), then run the lab again."),
]


def _how_to_add(config: Mapping[str, Any]) -> str:
    """Trusted markup (constants), or the results' own `how_to_add` text, escaped."""
    given = config.get("how_to_add")
    if isinstance(given, str) and given:
        return _e(given)
    lowered = f"{config['id']} {config['title']}".lower()
    for key, text in HOW_TO_ADD:
        if key in lowered:
            return text
    return "Install its server so that the lab finds it, then run the lab again."


def _rerun(results: Mapping[str, Any]) -> str:
    given = results.get("command")
    if isinstance(given, str) and given:
        return given
    runs = max((c["runs"] for c in results["cells"]), default=1)
    repeat = f" --repeat {runs}" if runs > 1 else ""
    return f"fencelock lab{' --quick' if results['quick'] else ''} --seed {results['seed']}{repeat} --out DIR"


def _source(source: str) -> str:
    if re.fullmatch(r"https?://\S+", source):
        return f'<a href="{_e(source)}">{_e(source)}</a>'
    return _e(source)



def _expectation(cell: Mapping[str, Any]) -> str:
    kind, words = expectation(cell)
    return f'<span class="exp {kind}">{_e(words)}</span>'


CSS = """
:root { --ink:#1d2433; --muted:#5a6275; --line:#d9dde6; --bg:#ffffff; --panel:#f6f7fa;
  --safe:#e3f2e6; --safe-ink:#145a24; --unsafe:#fde3e5; --unsafe-ink:#8c1020; --missed:#fff1cc; --missed-ink:#6b4e00;
  --skipped:#eceef2; --skipped-ink:#4a5160; --error:#efe3f5; --error-ink:#5c1f78; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.45 "DejaVu Sans", "Liberation Sans", Arial, sans-serif; color: var(--ink);
  background: var(--bg); }
header, main, footer { max-width: 1360px; margin: 0 auto; padding: 0 20px; }
header { padding-top: 18px; padding-bottom: 6px; border-bottom: 1px solid var(--line); }
h1 { font-size: 24px; margin: 0 0 4px; }
h2 { font-size: 19px; margin: 26px 0 8px; }
h3 { font-size: 16px; margin: 22px 0 4px; }
p { margin: 6px 0; }
.lede { color: var(--muted); margin: 0 0 10px; }
dl.meta { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; margin: 8px 0 10px; }
dl.meta dt { color: var(--muted); }
dl.meta dd { margin: 0; }
nav { font-size: 13.5px; margin: 4px 0 8px; }
nav a { margin: 0 2px; }
code { font-family: "DejaVu Sans Mono", "Liberation Mono", monospace; font-size: 13px; background: var(--panel);
  padding: 1px 5px; border-radius: 3px; }
table.matrix { border-collapse: separate; border-spacing: 3px; width: 100%; table-layout: fixed; }
table.matrix caption { text-align: left; color: var(--muted); padding-bottom: 4px; }
table.matrix th { font-weight: 600; text-align: left; vertical-align: bottom; padding: 4px 6px; font-size: 13px; }
table.matrix thead th { border-bottom: 2px solid var(--line); }
col.scenario-col { width: 22%; }
table.matrix th[scope=row] { vertical-align: top; font-weight: normal; border-top: 1px solid var(--line); }
table.matrix th[scope=row] .t { font-weight: 600; }
.num { display: inline-block; min-width: 1.6em; font-weight: 700; }
small, .small { font-size: 12px; color: var(--muted); display: block; }
td.cell { vertical-align: top; padding: 5px 7px; border-radius: 5px; font-size: 12.5px; border: 2px solid transparent; }
td.cell a { color: inherit; text-decoration: none; display: block; }
td.cell a:hover .verdict, td.cell a:focus .verdict { text-decoration: underline; }
.verdict { font-weight: 700; font-size: 14px; letter-spacing: .02em; }
.counts, .exp, .runs, .note { display: block; }
.exp.differs { font-weight: 700; }
.exp.better, .exp.boundary { font-style: italic; }
.note { color: var(--ink); overflow-wrap: anywhere; }
td.safe { background: var(--safe); color: var(--safe-ink); }
td.unsafe { background: var(--unsafe); color: var(--unsafe-ink); }
td.missed { background: var(--missed); color: var(--missed-ink); }
td.skipped { background: var(--skipped); color: var(--skipped-ink); }
td.error { background: var(--error); color: var(--error-ink); }
td.cell.differs { border: 2px dashed var(--ink); }
.legend { display: flex; flex-wrap: wrap; gap: 6px 16px; margin: 8px 0; font-size: 13px; padding: 0; list-style: none; }
.legend li { display: flex; align-items: center; gap: 6px; }
.chip { display: inline-block; padding: 0 7px; border-radius: 4px; font-weight: 700; }
.chip.safe { background: var(--safe); color: var(--safe-ink); }
.chip.unsafe { background: var(--unsafe); color: var(--unsafe-ink); }
.chip.missed { background: var(--missed); color: var(--missed-ink); }
.chip.skipped { background: var(--skipped); color: var(--skipped-ink); }
.chip.error { background: var(--error); color: var(--error-ink); }
.summary { font-size: 15px; }
ul.plain { margin: 4px 0; padding-left: 20px; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(640px, 1fr)); gap: 14px 18px; }
figure { margin: 0; padding: 10px 12px; background: var(--panel); border: 1px solid var(--line); border-radius: 6px; }
figure.differs { border: 2px dashed var(--ink); }
figure h4 { margin: 0 0 4px; font-size: 14px; display: flex; justify-content: space-between; gap: 8px; }
figure img { display: block; width: 100%; height: auto; background: #fff; border-radius: 3px; }
figcaption { font-size: 12.5px; color: var(--muted); margin-top: 4px; }
figcaption .note { color: var(--ink); }
details { margin-top: 4px; font-size: 12.5px; }
summary { cursor: pointer; color: var(--ink); }
table.events { border-collapse: collapse; margin-top: 4px; width: 100%; }
table.events th, table.events td { text-align: left; padding: 1px 6px; border-bottom: 1px solid var(--line); }
img.legend-picture { max-width: 960px; width: 100%; height: auto; display: block; }
footer { color: var(--muted); font-size: 12.5px; padding-top: 14px; padding-bottom: 28px; }
a { color: #1f4f8a; }
"""

# Marks every picture as loaded or broken once the page has loaded (for people and for the browser test).
SCRIPT = (
    "window.addEventListener('load',function(){var ok=0,bad=0;"
    "document.querySelectorAll('img').forEach(function(i){var g=i.complete?i.naturalWidth>0:false;"
    "i.setAttribute('data-loaded',g?'yes':'no');g?ok++:bad++;});"
    "document.body.setAttribute('data-pictures-loaded',ok);document.body.setAttribute('data-pictures-broken',bad);"
    "if(bad){var p=document.getElementById('broken');p.hidden=false;p.textContent=bad+' picture(s) failed to load.';}"
    "});"
)


def _csp() -> str:
    digest = base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()
    # Nothing but this page's own style, pictures and one script: even a string that escaped escaping could not run.
    return (f"default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'sha256-{digest}'; "
            "base-uri 'none'; form-action 'none'")


def _data_uri(svg: bytes) -> str:
    return "data:image/svg+xml;base64," + base64.b64encode(svg).decode("ascii")


def _events_table(events: Sequence[Mapping[str, Any]], limit: int = 300) -> str:
    rows = []
    for ev in sorted(events, key=lambda e: float(e["t"]))[:limit]:
        lease_end = "" if ev["lease_end"] is None else f"{float(ev['lease_end']):.3f}"
        fence = "" if ev["fence"] is None else ev["fence"]
        ok = {True: "yes", False: "no", None: ""}[ev["ok"]]
        rows.append(f"<tr><td>{float(ev['t']):.3f}</td><td>{_e(ev['worker'])}</td><td>{_e(ev['kind'])}</td>"
                    f"<td>{_e(fence)}</td><td>{ok}</td><td>{_e(lease_end)}</td><td>{_e(ev['detail'])}</td></tr>")
    more = "" if len(events) <= limit else f"<p>… and {len(events) - limit} more events (see results.json).</p>"
    return ("<table class=\"events\"><thead><tr><th scope=\"col\">t (s)</th><th scope=\"col\">worker</th>"
            "<th scope=\"col\">event</th><th scope=\"col\">fence</th><th scope=\"col\">ok</th>"
            "<th scope=\"col\">lease end (s)</th><th scope=\"col\">detail</th></tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>" + more)


def _verdict_html(cell: Mapping[str, Any]) -> str:
    v = cell["verdict"]
    return f'<span class="verdict">{SYMBOL[v]} {_e(v)}</span>'



def page(results: Mapping[str, Any]) -> str:
    configs = {c["id"]: c for c in results["configs"]}
    scenarios = sorted(results["scenarios"], key=lambda s: (s["number"], s["id"]))
    cells: dict[tuple[str, str], Mapping[str, Any]] = {(c["scenario"], c["config"]): c for c in results["cells"]}
    # Cells that name a configuration or scenario the lists lack still appear, under their bare id.
    for c in results["cells"]:
        configs.setdefault(c["config"], {"id": c["config"], "title": c["config"], "available": True,
                                         "why_unavailable": None})
        if all(s["id"] != c["scenario"] for s in scenarios):
            scenarios.append({"id": c["scenario"], "number": len(scenarios) + 1, "title": c["scenario"],
                              "fault": "", "source": ""})
    anchors: dict[tuple[str, str], str] = {}
    used: set[str] = set()
    for key in cells:
        anchor = base = f"cell-{_slug(key[0])}--{_slug(key[1])}"
        n = 2
        while anchor in used:
            anchor, n = f"{base}-{n}", n + 1
        used.add(anchor)
        anchors[key] = anchor

    out: list[str] = []
    out.append(_head(results))
    out.append(_header(results))
    out.append("<main>")
    out.append(_matrix(results, scenarios, configs, cells, anchors))
    out.append(_unavailable(configs))
    legend = _data_uri(svg.legend_svg())
    out.append('<section id="timelines"><h2>Timelines</h2>'
               "<p>One picture per cell: one lane per worker, time running right. “refused” at the end of a "
               "bar: its release was refused; “lost”: the worker learnt it had lost the lease. When a long "
               "pause ends in a burst, a second panel zooms on the burst. Each picture has a text "
               "description and the full list of events beneath it.</p>"
               f'<img class="legend-picture" src="{legend}" alt="Legend: a solid blue bar is a valid lease; '
               "a hatched red bar is a lease held past its end; a black tick is a release; a green circle is "
               "an accepted write; a dark X is a rejected write; a red star labelled STALE is a stale write "
               "that was accepted; a hollow circle is a write with no answer; a hollow triangle is a refused "
               "acquire; a dashed purple line labelled F1, F2 is a fault; a yellow band marks two holders at "
               'once."/>')
    for scenario in scenarios:
        out.append(_scenario_timelines(scenario, configs, cells, anchors))
    out.append("</section>")
    out.append("</main>")
    out.append(f"<footer><p>fencelock lab report · results version {_e(results['version'])} · "
               "every verdict comes from the lab's checker; the pictures only "
               "show its evidence.</p></footer>")
    out.append(f"<script>{SCRIPT}</script></body></html>\n")
    return "\n".join(out)


def _head(results: Mapping[str, Any]) -> str:
    mode = "quick" if results["quick"] else "full"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/>"
            f'<meta http-equiv="Content-Security-Policy" content="{_e(_csp())}"/>'
            '<meta name="viewport" content="width=device-width, initial-scale=1"/>'
            f"<title>fencelock lab report: seed {_e(results['seed'])}, {mode} run</title>"
            f"<style>{CSS}</style></head><body>")


def _header(results: Mapping[str, Any]) -> str:
    scenarios = sorted(results["scenarios"], key=lambda s: (s["number"], s["id"]))
    nav = ('<nav aria-label="Contents"><a href="#verdicts">Verdicts</a> · <a href="#unavailable">Not run</a> · '
           '<a href="#timelines">Timelines</a>: '
           + " ".join(f'<a href="#scenario-{_slug(s["id"])}" title="{_e(s["title"])}">{_e(scenario_label(s))}</a>'
                      for s in scenarios) + "</nav>")
    mode = ("quick (<code>--quick</code>: fewer, shorter runs)" if results["quick"]
            else "full")
    return ("<header><h1>fencelock lab report</h1>"
            "<p class=\"lede\">The classic distributed-lock failures, injected for real on real servers, and which "
            "lock configurations kept the resource safe.</p>"
            "<dl class=\"meta\">"
            f"<dt>Seed</dt><dd>{_e(results['seed'])}</dd>"
            f"<dt>Mode</dt><dd>{mode}</dd>"
            f"<dt>Started</dt><dd>{_e(results['started'])}</dd>"
            f"<dt>Duration</dt><dd>{float(results['duration_s']):.1f} s</dd>"
            f"<dt>Run it again</dt><dd><code>{_e(_rerun(results))}</code></dd>"
            "</dl><p id=\"broken\" class=\"note\" hidden=\"hidden\"></p>"
            f"{nav}</header>")


def _matrix(results: Mapping[str, Any], scenarios: Sequence[Mapping[str, Any]], configs: Mapping[str, Any],
            cells: Mapping[tuple[str, str], Mapping[str, Any]], anchors: Mapping[tuple[str, str], str]) -> str:
    tally = dict.fromkeys(VERDICTS, 0)
    kinds: dict[str, list[tuple[str, str]]] = {"differs": [], "better": [], "boundary": []}
    for key, each in cells.items():
        tally[each["verdict"]] += 1
        kinds.get(expectation(each)[0], []).append(key)
    differs, better = kinds["differs"], kinds["better"]
    judged = tally["SAFE"] + tally["UNSAFE"]
    out = ['<section id="verdicts"><h2>Verdicts</h2>']
    out.append(f'<p class="summary">{plural(len(cells), "cell")}: '
               + ", ".join(f"{n} {_e(v)}" for v, n in tally.items() if n)
               + f". Of the {judged} with a verdict, {judged - len(differs) - len(better)} agree with the literature"
               + (f", <strong>{len(better)} do better than it predicts</strong> "
                  '(<a href="#better">why</a>)' if better else "")
               + (f" and <strong>{len(differs)} differ</strong> (dashed outline)." if differs else ".") + "</p>")
    out.append('<ul class="legend" aria-label="What the verdicts mean">'
               + "".join(f'<li><span class="chip {CLASS[v]}">{SYMBOL[v]} {_e(v)}</span> {_e(MEANING[v])}</li>'
                         for v in VERDICTS) + "</ul>")
    out.append('<table class="matrix"><caption>Scenario &#215; configuration. Counts are totals over the runs; '
               "“predicted” is what the source in the first column predicts. Each cell links to its timeline."
               "</caption><colgroup><col class=\"scenario-col\"/>"
               + "<col/>" * len(configs) + "</colgroup><thead><tr><th scope=\"col\">Scenario (fault; source)</th>")
    for config in configs.values():
        out.append(f'<th scope="col">{_e(config["title"])}</th>')
    out.append("</tr></thead><tbody>")
    for s in scenarios:
        out.append(f'<tr><th scope="row"><span class="num">{_e(scenario_label(s))}</span><span class="t">'
                   f'{_e(s["title"])}</span><small>{_e(s["fault"])}</small>'
                   f'<small>Source: {_source(s["source"])}</small></th>')
        for cid in configs:
            cell = cells.get((s["id"], cid))
            if cell is None:
                out.append('<td class="cell skipped"><span class="verdict">&#8211; not in these results</span></td>')
                continue
            v = cell["verdict"]
            klass = f"cell {CLASS[v]}" + (" differs" if (s["id"], cid) in differs else "")
            if v == "SKIPPED" and not configs[cid]["available"]:
                out.append(f'<td class="{klass}"><a href="#unavailable">{_verdict_html(cell)}</a>'
                           f'<span class="note">not available here: <a href="#unavailable">how to add it</a>'
                           f"</span>{_expectation(cell)}</td>")
                continue
            if v == "SKIPPED":                                     # e.g. a scenario that does not apply
                out.append(f'<td class="{klass}"><a href="#{anchors[(s["id"], cid)]}">{_verdict_html(cell)}</a>'
                           f'<span class="note">{_e(short(cell["note"] or "skipped", 160))}</span>'
                           f"{_expectation(cell)}</td>")
                continue
            body = [f'<a href="#{anchors[(s["id"], cid)]}">{_verdict_html(cell)}</a>']
            if v in ("SAFE", "UNSAFE"):
                c = cell["counts"]
                stale = f"<strong>{_e(stale_line(c))}</strong>" if c["stale_accepted"] else _e(stale_line(c))
                body.append(f'<span class="counts">{stale}<br/>{_e(other_counts(c))}</span>')
            body.append(_expectation(cell))
            if v != "SKIPPED":
                body.append(f'<span class="runs small">{plural(cell["runs"], "run")}, '
                            f'{plural(cell["counts"]["faults"], "fault")} injected</span>')
            if cell["note"] and (v in ("ERROR", "FAULT-MISSED") or (s["id"], cid) in differs):
                body.append(f'<span class="note">{_e(short(cell["note"], 160))}</span>')
            out.append(f'<td class="{klass}">{"".join(body)}</td>')
        out.append("</tr>")
    out.append("</tbody></table>")
    if differs:
        out.append('<h3 id="differences">Where this run differs from the prediction</h3><ul class="plain">')
        names = {s["id"]: s for s in scenarios}
        for key in differs:
            each, s = cells[key], names[key[0]]
            predicted = (f"where fencelock should be SAFE although {_e(s['source'])} predicts "
                         f"{_e(each['expected'])} ({_e(sentence(str(each['beyond'])))})" if each.get("beyond")
                         else f"where {_e(s['source'])} predicts {_e(each['expected'])}.")
            out.append(f'<li><a href="#{anchors[key]}">Scenario {_e(scenario_label(s))} on '
                       f'{_e(configs[key[1]]["title"])}'
                       f'</a>: {_e(each["verdict"])}, {predicted}'
                       + (f" {_e(each['note'])}" if each["note"] else "") + "</li>")
        out.append("</ul>")
    out.append(_explained(scenarios, configs, cells, anchors, better, "better",
                          "Where fencelock does better than the literature predicts", "beyond"))
    out.append(_explained(scenarios, configs, cells, anchors, kinds["boundary"], "boundary",
                          "Where the literature's prediction holds because a stated assumption does not", "boundary"))
    out.append("</section>")
    return "".join(out)


def _explained(scenarios: Sequence[Mapping[str, Any]], configs: Mapping[str, Any],
               cells: Mapping[tuple[str, str], Mapping[str, Any]], anchors: Mapping[tuple[str, str], str],
               keys: Sequence[tuple[str, str]], anchor: str, title: str, field: str) -> str:
    """A list of the cells whose verdict the results explain (`field`: "beyond" or "boundary"), with the reason."""
    if not keys:
        return ""
    names = {s["id"]: s for s in scenarios}
    out = [f'<h3 id="{anchor}">{_e(title)}</h3><ul class="plain">']
    for key in keys:
        each, s = cells[key], names[key[0]]
        out.append(f'<li><a href="#{anchors[key]}">Scenario {_e(scenario_label(s))} on '
                   f'{_e(configs[key[1]]["title"])}</a>: {_e(each["verdict"])}, where {_e(s["source"])} predicts '
                   f'{_e(each["expected"])}. Why: {_e(sentence(str(each[field])))}</li>')
    out.append("</ul>")
    return "".join(out)


def _unavailable(configs: Mapping[str, Mapping[str, Any]]) -> str:
    missing = [c for c in configs.values() if not c["available"]]
    if not missing:
        return ('<section id="unavailable"><h2>Configurations not run</h2><p>None: every configuration ran.</p>'
                "</section>")
    items = "".join(f'<li><strong>{_e(c["title"])}</strong> (<code>{_e(c["id"])}</code>): '
                    f'{_e(c["why_unavailable"] or "not available")}. {_how_to_add(c)}</li>' for c in missing)
    return (f'<section id="unavailable"><h2>Configurations not run</h2><p>Their cells are SKIPPED. To add them:</p>'
            f'<ul class="plain">{items}</ul></section>')


def _scenario_timelines(scenario: Mapping[str, Any], configs: Mapping[str, Mapping[str, Any]],
                        cells: Mapping[tuple[str, str], Mapping[str, Any]], anchors: Mapping[tuple[str, str], str]
                        ) -> str:
    out = [f'<section class="scenario" id="scenario-{_slug(scenario["id"])}">'
           f'<h3>{_e(scenario_label(scenario))}. {_e(scenario["title"])}</h3>'
           f'<p><strong>Fault:</strong> {_e(sentence(scenario["fault"]))} <strong>Source:</strong> '
           f'{_source(scenario["source"])}{"" if sentence(scenario["source"]) == scenario["source"] else "."}</p>'
           '<div class="grid">']
    not_here = []
    for cid, config in configs.items():
        cell = cells.get((scenario["id"], cid))
        if cell is None:
            continue
        if cell["verdict"] == "SKIPPED" and not config["available"]:
            not_here.append(config["title"])                      # said once, under "Configurations not run"
            continue
        anchor = anchors[(scenario["id"], cid)]
        differs = cell["verdict"] in ("SAFE", "UNSAFE") and not cell["matches_expectation"]
        head = (f'<h4><span>{_e(config["title"])}</span><span class="chip {CLASS[cell["verdict"]]}">'
                f'{SYMBOL[cell["verdict"]]} {_e(cell["verdict"])}</span></h4>')
        note = f'<span class="note">{_e(cell["note"])}</span> ' if cell["note"] else ""
        if cell["verdict"] == "SKIPPED":
            out.append(f'<figure id="{anchor}" class="skipped">{head}<figcaption>{note}Not run, so there is no '
                       "timeline.</figcaption></figure>")
            continue
        tl = timeline(cell["events"])
        drawn, zoom = svg.timeline_svg(tl)
        picture = _data_uri(drawn)
        zoomed = "" if zoom is None else f" The lower panel zooms on {zoom[0]:.3f} to {zoom[1]:.3f} s."
        lines = describe(tl) or ["No events were recorded."]
        counts = counts_line(cell["counts"]) if cell["verdict"] in ("SAFE", "UNSAFE") else ""
        fault_list = "; ".join(f"{m.label} at {secs(m.t)}: {m.detail}" for m in tl.faults)
        out.append(
            f'<figure id="{anchor}" class="timeline{" differs" if differs else ""}">{head}'
            f'<img src="{picture}" alt="{_e(alt_text(scenario, config, cell, tl) + zoomed)}" '
            f'aria-describedby="{anchor}-text" loading="eager"/>'
            f'<figcaption>{note}{_e(counts)}{". " if counts else ""}{_expectation(cell)}'
            + (f'<span class="small">Faults: {_e(fault_list)}</span>' if fault_list else "")
            + f'<details><summary>Described in words, and every event ({len(cell["events"])})</summary>'
            f'<ul class="plain" id="{anchor}-text">' + "".join(f"<li>{_e(line)}</li>" for line in lines)
            + "</ul>" + _events_table(cell["events"]) + "</details></figcaption></figure>")
    out.append("</div>")
    if not_here:
        out.append(f'<p class="small">Not run here: {_e(", ".join(not_here))} (see '
                   '<a href="#unavailable">Configurations not run</a>).</p>')
    out.append("</section>")
    return "".join(out)
