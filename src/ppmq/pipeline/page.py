"""report.html: one self-contained page (charts as embedded PNG or inline SVG,
tables as HTML, a host filter in plain JS) that can be mailed or archived without
the Parquet files next to it, and read offline.

Every table row and chart of one host carries `data-host`; every chart that mixes
hosts sits in a `data-fleet` block. The host filter hides the others' rows and
panels and the mixed charts, and keeps its terms in the URL fragment
(`report.html#hosts=web1,db*`), so a filtered view can be linked to.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Callable
from datetime import datetime
from typing import Any

Row = dict[str, Any]

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1150px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 2em; border-bottom: 1px solid #ddd; }
div.table { overflow: auto; width: fit-content; max-width: 100%; max-height: 36em; margin: 0.5em 0; border: 1px solid #eee; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { padding: 0.25em 0.7em; border-bottom: 1px solid #eee; text-align: right; white-space: nowrap; }
th { background: #f5f5f5; position: sticky; top: 0; } td.text, th.text { text-align: left; }
img { max-width: 100%; } .note { color: #666; font-size: 0.85em; }
[hidden] { display: none !important; }
#filter { position: sticky; top: 0; background: #fff; padding: 0.5em 0; border-bottom: 1px solid #ddd; z-index: 1; }
#host-filter { width: 24em; }
figure.multiple { display: inline-block; margin: 0 0.6em 0.8em 0; font-size: 0.75em; }
figure.top { margin: 0.5em 0 1em; } figure.top figcaption { font-weight: bold; font-size: 0.9em; }
figure.top svg { font-size: 11px; } .legend .key { border-top: 3px solid; margin: 0 0.5em; padding-top: 1px; }
"""

# Terms are host names, or prefixes ending in `*`, separated by commas or spaces.
_SCRIPT = """
(function () {
  const input = document.getElementById("host-filter");
  const count = document.getElementById("host-count");
  const all = [...new Set([...document.querySelectorAll("[data-host]")].map(e => e.dataset.host))];
  const matches = (terms, host) => terms.some(t => t.endsWith("*") ? host.startsWith(t.slice(0, -1)) : host === t);
  function apply() {
    const terms = input.value.split(/[\\s,]+/).filter(Boolean);
    const on = terms.length > 0;
    for (const e of document.querySelectorAll("[data-host]")) e.hidden = on && !matches(terms, e.dataset.host);
    for (const e of document.querySelectorAll("[data-fleet]")) e.hidden = on;
    const shown = on ? all.filter(h => matches(terms, h)).length : all.length;
    count.textContent = "showing " + shown + " of " + all.length + " hosts" + (on ? "; charts across hosts hidden" : "");
    history.replaceState(null, "", on ? "#hosts=" + terms.map(encodeURIComponent).join(",") : location.pathname);
  }
  const fragment = location.hash.match(/^#hosts=(.*)$/);
  if (fragment) input.value = fragment[1].split(",").map(decodeURIComponent).join(" ");
  input.addEventListener("input", apply);
  apply();
})();
"""


def figure(column: str, value: Any) -> str:
    """A figure as the page writes it wherever it appears (tables, captions, bar labels),
    by the name of its column: a rate (`*_rate`, a count per delivered message) as a
    percentage, seconds (`*_s`) with their unit, both to 3 significant digits; counts
    with thousands separators; times to the second. Plain text, not escaped."""
    if value is None:
        return "-"
    if column.endswith("_rate"):
        return f"{100 * value:.3g}%"
    if column.endswith("_s"):
        return f"{_number(value)} s"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, (int, float)):
        return _number(value)
    return str(value)


def _number(value: float) -> str:
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def shown(column: str, value: Any, counts: Row) -> str:
    """A figure in its format, or, empty, why: from `counts`, the row it is a figure of."""
    return figure(column, value) if value is not None else why_empty(counts, column)


def why_empty(row: Row, column: str) -> str:
    """What an empty cell of `column` says, from the counts of its row: a latency or a
    rate is empty because there was nothing to measure, and the row tells what."""
    if column.startswith("ack_p"):
        # acks whose publish is older than the journals read have no latency (ack_latency.py)
        return "no acks" if not row.get("acked") else "publishes not read"
    if column.startswith("deliver_p"):
        return "no deliveries" if not row.get("delivered") else "no first deliveries"
    if column.endswith("_rate"):
        return "nothing delivered"
    return "-"


def table(rows: list[Row], columns: list[str], cell: Callable[[Row, str], str] | None = None) -> str:
    """An HTML table of `columns`, in a box of the page's width that scrolls a wide or
    long table inside it, with its header row kept in view; text columns
    left-aligned, numbers right. `cell` writes a cell (plain text) in place of each
    figure's own format and an empty one's reason."""
    if not rows:
        return none("nothing in the journals")
    write = cell or (lambda r, c: shown(c, r.get(c), r))
    text = {c for c in columns if any(isinstance(r.get(c), str) for r in rows)}
    cls = lambda c: ' class="text"' if c in text else ""  # noqa: E731
    head = "".join(f"<th{cls(c)}>{html.escape(c)}</th>" for c in columns)
    body = "".join(f"<tr{_host(r)}>" + "".join(f"<td{cls(c)}>{html.escape(write(r, c))}</td>" for c in columns) + "</tr>" for r in rows)
    return f'<div class="table"><table><tr>{head}</tr>{body}</table></div>'


def none(why: str) -> str:
    """What stands for a chart or table with nothing to show, and why."""
    return f'<p class="note none">none: {html.escape(why)}</p>'


def _host(row: Row) -> str:
    """The row's data-host attribute, which the host filter matches."""
    host = row.get("host")
    return f' data-host="{html.escape(host)}"' if isinstance(host, str) else ""


def fleet_wide(body: str) -> str:
    """A block that mixes hosts: the host filter hides it, as it cannot be cut per host."""
    return f"<div data-fleet>{body}</div>"


def _filter(hosts: list[str]) -> str:
    options = "".join(f'<option value="{html.escape(h)}">' for h in hosts)
    return (
        '<div id="filter"><label>hosts <input id="host-filter" list="host-names" placeholder="all (names or prefix*, comma separated)"></label> '
        f'<span id="host-count" class="note"></span><datalist id="host-names">{options}</datalist></div>'
    )


def image(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def page(title: str, sections: list[tuple[str, str]], generated: datetime, hosts: list[str]) -> str:
    """The whole document: a title, the host filter, then (heading, HTML) sections in order."""
    parts = [f"<h2>{html.escape(h)}</h2>\n{body}" for h, body in sections]
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{_STYLE}</style></head><body>\n<h1>{html.escape(title)}</h1>"
        f'<p class="note">generated {generated:%Y-%m-%d %H:%M:%S} UTC by ppmq report</p>\n'
        + _filter(hosts)
        + "\n".join(parts)
        + f"\n<script>{_SCRIPT}</script>\n</body></html>\n"
    )
