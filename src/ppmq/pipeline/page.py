"""report.html: one self-contained page (charts as embedded PNG, tables as HTML)
that can be mailed or archived without the Parquet files next to it."""

from __future__ import annotations

import base64
import html
from datetime import datetime
from typing import Any

Row = dict[str, Any]

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1150px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
th, td { padding: 0.25em 0.7em; border-bottom: 1px solid #eee; text-align: right; }
th { background: #f5f5f5; } td.text, th.text { text-align: left; }
img { max-width: 100%; } .note { color: #666; font-size: 0.85em; }
"""


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return html.escape(str(value))


def table(rows: list[Row], columns: list[str]) -> str:
    """An HTML table of `columns`; text columns left-aligned, numbers right."""
    if not rows:
        return '<p class="note">nothing in the journals</p>'
    text = {c for c in columns if any(isinstance(r.get(c), str) for r in rows)}
    cls = lambda c: ' class="text"' if c in text else ""  # noqa: E731
    head = "".join(f"<th{cls(c)}>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td{cls(c)}>{_cell(r.get(c))}</td>" for c in columns) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def image(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def page(title: str, sections: list[tuple[str, str]], generated: datetime) -> str:
    """The whole document: a title, then (heading, HTML) sections in order."""
    parts = [f"<h2>{html.escape(h)}</h2>\n{body}" for h, body in sections]
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{_STYLE}</style></head><body>\n<h1>{html.escape(title)}</h1>"
        f'<p class="note">generated {generated:%Y-%m-%d %H:%M:%S} UTC by ppmq report</p>\n'
        + "\n".join(parts)
        + "\n</body></html>\n"
    )
