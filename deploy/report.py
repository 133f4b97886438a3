"""``registry up --report FILE.html``: one self-contained page a person can read.

The page shows the parity ladder, the dispatch table, a per-rank startup timeline chart and a per-rank
memory chart. It is rendered from the bring-up's evidence predicate (plain JSON data), embedded in the
page as one JSON document; a small inline script draws the two charts as SVG, so the page needs no
network, no fonts and no files beside it. Everything taken from the data is escaped: tables through
:func:`html.escape`, the embedded JSON with ``<``, ``>`` and ``&`` written as JSON unicode escapes, the
charts through ``textContent``.

The fields read (all optional; what is missing is shown as missing):

- ``manifest``, ``repository``, ``tag`` (``{"version", "digest"}``), ``topology`` (``{"tp", "ep", "pp"}``),
  ``runtime`` (``{"activations", "float32"}``: the operators' activation dtype and which ran float32
  instead), ``created``, ``passed``;
- ``parity``: a list of ``{"level", "name", "passed", "value", "tolerance", "detail"}`` (``passed`` None
  with ``status`` "not run" for a level the bring-up did not run; a non-finite measure as the text
  ``"NaN"`` / ``"Infinity"``, shown as such; the charts draw it as nothing and list it by name);
- ``ladder``: the ladder's budget and coverage (``{"mode", "operators", "full", "sampled", "classes"}``,
  each class ``{"rank", "kernel", "representative", "represents", "covered"}``);
- ``dispatch``: a list of ``{"rank", "weight", "phase", "kernel", "transformation", "activations",
  "path"}`` (``path``: ``slow`` where the kernel runs its unvectorised path for the dtype);
- ``timeline``: ``{rank: {stage: seconds}}`` (stages in the order they ran);
- ``ledger``: ``{rank: {component: bytes}}`` (what the rank's memory is made of: drawn stacked);
- ``memory``: ``{rank: {measure: bytes}}`` (bytes on disk = ``bytes_assigned``, the rank's share of the
  stored blobs; ``bytes_fetched``; ``codes_retained`` / ``codes_released``, the loaded planes kept
  after preparation (those the operators use in place) and handed back; ``host_resident``,
  ``host_resident_growth``, ``host_peak`` (the process's high-water mark, ``VmHWM``);
  ``device_resident``, ``device_peak``) and ``devices``: ``{rank: "cpu" | "cuda:0 NAME"}``: one bar
  per measure (they are not parts of one whole), with the repack workspace peak from ``ledger``; a CPU
  rank's device bars say "none (cpu)" instead of drawing an empty bar.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from shardport.provenance.canonical import finite_text

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #1b1f24; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
table { border-collapse: collapse; margin: 8px 0; }
td, th { border: 1px solid #c9d1d9; padding: 3px 8px; text-align: left; font-size: 13px; }
th { background: #f3f5f7; }
.pass { color: #116329; font-weight: 600; } .fail { color: #b42318; font-weight: 600; }
.meta td:first-child { font-weight: 600; } svg text { font: 11px system-ui, sans-serif; }
"""

# Draws #timeline and #memory from the embedded data: one horizontal bar per rank, one segment per
# stage (timeline) or component (memory), with a legend. Plain DOM calls; no library.
_SCRIPT = """
(function () {
  const data = JSON.parse(document.getElementById("evidence-data").textContent);
  const NS = "http://www.w3.org/2000/svg";
  const colors = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#9c755f"];
  function el(name, attrs, text) {
    const node = document.createElementNS(NS, name);
    for (const k in attrs) node.setAttribute(k, attrs[k]);
    if (text !== undefined) node.textContent = text;
    return node;
  }
  // a measure that is not a finite number (the evidence writes NaN as "NaN") draws nothing and is
  // listed beside its rank's bar instead
  function num(x) { const v = Number(x); return Number.isFinite(v) ? v : 0; }
  function finite(x) { return x === undefined || x === null || Number.isFinite(Number(x)); }
  function stacked(id, rows, unit, scale) {
    const host = document.getElementById(id);
    const ranks = Object.keys(rows || {}).sort((a, b) => Number(a) - Number(b));
    if (ranks.length === 0) { host.textContent = "no data"; return; }
    const keys = [];
    ranks.forEach(r => Object.keys(rows[r]).forEach(k => { if (!keys.includes(k)) keys.push(k); }));
    const totals = ranks.map(r => Object.values(rows[r]).reduce((a, b) => a + num(b), 0));
    const max = Math.max(...totals, 1e-12), width = 640, left = 70, bar = 22, gap = 8;
    const height = ranks.length * (bar + gap) + 40 + 18 * Math.ceil(keys.length / 4);
    const svg = el("svg", {width: left + width + 120, height: height, role: "img", "aria-label": id});
    ranks.forEach((r, i) => {
      const y = 10 + i * (bar + gap);
      svg.appendChild(el("text", {x: 4, y: y + 15}, "rank " + r));
      let x = left;
      keys.forEach((k, j) => {
        const v = num(rows[r][k]), w = width * v / max;
        if (w > 0) {
          const rect = el("rect", {x: x, y: y, width: w, height: bar, fill: colors[j % colors.length],
                                   "class": "mark", "data-key": k});
          rect.appendChild(el("title", {}, k + ": " + (v / scale).toFixed(3) + " " + unit));
          svg.appendChild(rect);
          x += w;
        }
      });
      const odd = Object.keys(rows[r]).filter(k => !finite(rows[r][k]));
      svg.appendChild(el("text", {x: x + 6, y: y + 15}, (totals[i] / scale).toFixed(2) + " " + unit +
                         (odd.length ? " (not finite: " + odd.join(", ") + ")" : "")));
    });
    keys.forEach((k, j) => {
      const y = ranks.length * (bar + gap) + 24 + 18 * Math.floor(j / 4), x = left + (j % 4) * 160;
      svg.appendChild(el("rect", {x: x, y: y - 10, width: 12, height: 12, fill: colors[j % colors.length]}));
      svg.appendChild(el("text", {x: x + 16, y: y}, k));
    });
    host.appendChild(svg);
  }
  function measures(id, memory, ledger, devices) {
    const host = document.getElementById(id);
    const ranks = Object.keys(memory || {}).sort((a, b) => Number(a) - Number(b));
    if (ranks.length === 0) { host.textContent = "no data"; return; }
    const fields = [["bytes_assigned", "on disk (share)"], ["bytes_fetched", "fetched"],
                    ["codes_retained", "loaded, retained"], ["codes_released", "loaded, released"],
                    ["host_resident", "host resident"], ["host_resident_growth", "host growth"],
                    ["host_peak", "host peak"],
                    ["device_resident", "device resident"], ["device_peak", "device peak"],
                    ["repack_workspace_peak", "repack workspace peak"]];
    const value = (r, k) => num((k in (memory[r] || {}) ? memory[r] : (ledger || {})[r] || {})[k]);
    const max = Math.max(...ranks.flatMap(r => fields.map(f => value(r, f[0]))), 1);
    const left = 170, width = 520, bar = 12, gap = 4, head = 20;
    const block = head + fields.length * (bar + gap) + 8;
    const svg = el("svg", {width: left + width + 160, height: ranks.length * block + 4, role: "img",
                           "aria-label": id});
    ranks.forEach((r, i) => {
      const top = 4 + i * block, device = String((devices || {})[r] || "cpu");
      svg.appendChild(el("text", {x: 4, y: top + 13, "font-weight": "bold"}, "rank " + r + " on " + device));
      fields.forEach(([k, label], j) => {
        const y = top + head + j * (bar + gap), v = value(r, k), w = width * v / max;
        svg.appendChild(el("text", {x: 12, y: y + 10}, label));
        if (w > 0) {
          const rect = el("rect", {x: left, y: y, width: w, height: bar, fill: colors[j % colors.length],
                                   "class": "bar", "data-key": k});
          rect.appendChild(el("title", {}, label + ": " + (v / 1048576).toFixed(3) + " MiB"));
          svg.appendChild(rect);
        }
        const none = k.startsWith("device") && device.startsWith("cpu");
        svg.appendChild(el("text", {x: left + w + 6, y: y + 10},
                           none ? "none (cpu)" : (v / 1048576).toFixed(2) + " MiB"));
      });
    });
    host.appendChild(svg);
  }
  stacked("timeline", data.timeline, "s", 1);
  stacked("memory", data.ledger, "MiB", 1048576);
  measures("measures", data.memory, data.ledger, data.devices);
  document.body.setAttribute("data-charts", "drawn");
})();
"""


def _cell(value: Any) -> str:
    if value is None:
        return "<td>-</td>"
    if isinstance(value, bool):
        return f'<td class="{"pass" if value else "fail"}">{"pass" if value else "FAIL"}</td>'
    if isinstance(value, float):
        return f"<td>{value:.4g}</td>"
    if isinstance(value, (dict, list)):
        return f"<td><code>{html.escape(json.dumps(value, sort_keys=True))}</code></td>"
    return f"<td>{html.escape(str(value))}</td>"


def _table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], empty: str) -> str:
    if not rows:
        return f"<p>{html.escape(empty)}</p>"
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(_cell(r.get(c)) for c in columns) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _script_json(data: Mapping[str, Any]) -> str:
    """JSON safe inside a ``<script>`` element: no ``</script>``, no HTML-significant characters.

    Strict JSON (``JSON.parse`` takes no NaN): a non-finite number is written as text, as the
    evidence writes it (:func:`shardport.provenance.canonical.finite_text`).
    """
    text = json.dumps(finite_text(data), sort_keys=True, default=str, allow_nan=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def _coverage(ladder: Any) -> list[str]:
    """The ladder's budget: which operators ran the full ladder, which their class representative covers."""
    if not isinstance(ladder, Mapping):
        return []
    mode = ladder.get("mode")
    if mode == "off":
        summary = "Parity L0-L3 were not run (--ladder off)."
    else:
        summary = (
            f"--ladder {mode}: {ladder.get('operators')} operators; the full ladder (L0-L3) on "
            f"{ladder.get('full')}; {ladder.get('sampled')} sampled (L0, L1 and the witness rows on the "
            "weight itself; L2 reconstruction and L3 proved on its class representative)."
        )
    classes = [c for c in ladder.get("classes") or [] if isinstance(c, Mapping) and c.get("represents")]
    return [
        "<h2>Ladder coverage</h2>",
        f"<p>{html.escape(summary)}</p>",
        _table(
            classes,
            ["rank", "kernel", "representative", "represents", "covered"],
            "every operator ran the full ladder" if mode != "off" else "no ladder ran",
        ),
    ]


def _activations(runtime: Any) -> str | None:
    """The runtime's activation dtype, with the operators that ran float32 instead (if any)."""
    if not isinstance(runtime, Mapping):
        return None
    asked = str(runtime.get("activations"))
    resolved = sorted({str(v) for v in (runtime.get("ranks") or {}).values()})
    if asked == "auto" and resolved:
        asked = f"auto ({', '.join(resolved)})"
    other = list(runtime.get("float32") or [])
    if not other:
        return asked
    return f"{asked}; {len(other)} operators ran float32: {'; '.join(other[:3])}"


def render_report(evidence: Mapping[str, Any]) -> str:
    """The page for one bring-up's evidence predicate."""
    tag = evidence.get("tag") or {}
    meta = [
        ("repository", evidence.get("repository")),
        ("manifest", evidence.get("manifest")),
        ("tag version", tag.get("version") if isinstance(tag, Mapping) else tag),
        ("topology", evidence.get("topology")),
        ("activations", _activations(evidence.get("runtime"))),
        ("created", evidence.get("created")),
        ("result", evidence.get("passed")),
    ]
    parity = [
        {**r, "passed": r.get("status") or "not run"} if r.get("passed") is None else r
        for r in evidence.get("parity") or []
    ]
    dispatch = list(evidence.get("dispatch") or [])
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8"><title>shardport bring-up evidence</title>',
        f"<style>{_STYLE}</style></head><body>",
        "<h1>shardport bring-up evidence</h1>",
        '<table class="meta">' + "".join(f"<tr><td>{k}</td>{_cell(v)}</tr>" for k, v in meta) + "</table>",
        "<h2>Parity ladder</h2>",
        _table(parity, ["level", "name", "passed", "value", "tolerance", "detail"], "no parity results"),
        *_coverage(evidence.get("ladder")),
        "<h2>Dispatch</h2>",
        _table(
            dispatch,
            ["rank", "weight", "phase", "kernel", "transformation", "activations", "path"],
            "no dispatch trace",
        ),
        "<h2>Startup timeline per rank (seconds)</h2>",
        '<div id="timeline"></div>',
        "<h2>Memory per rank</h2>",
        "<p>What the rank's memory is made of (component ledger):</p>",
        '<div id="memory"></div>',
        "<p>Bytes on disk, fetched, host and device resident, repack workspace peak:</p>",
        '<div id="measures"></div>',
        f'<script type="application/json" id="evidence-data">{_script_json(evidence)}</script>',
        f"<script>{_SCRIPT}</script>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def write_report(evidence: Mapping[str, Any], path: Path) -> Path:
    """Write the page to ``path`` atomically; return the path.

    A temporary file in its folder, created without following links, flushed and renamed over it; a
    link or anything but a regular file at ``path`` is refused, never followed.
    """
    from shardport.registry.output.writers import write_file

    write_file(path, render_report(evidence).encode("utf-8"), durable=True)
    return path
