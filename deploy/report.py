"""``registry up --report FILE.html``: one self-contained page a person can read.

The page opens with the verdict (passed or failed; repository, manifest digest, tag, topology) and one
line per parity level L0-L5 (its status, the deciding value against its tolerance); then the charts of
L3 operator error per layer and L4 |Δ| per position (:mod:`.report_charts`), the parity checks, the
ladder's coverage, the dispatch grouped as the kernel mix per rank and weight class with every trace
behind a collapsed ``<details>`` (:mod:`.report_views`), a per-rank startup timeline chart and a
per-rank memory chart. The last two are drawn as SVG by a small inline script from the data they need,
embedded as one JSON document (with the verdict's fields; the signed predicate itself is what
``registry evidence --show`` prints), so the page needs no network, no fonts and no files beside it.
Everything taken from the data is escaped: tables and the static charts through :func:`html.escape`, the
embedded JSON with ``<``, ``>`` and ``&`` written as JSON unicode escapes, the script's charts through
``textContent``. A 135M-class bring-up (30 layers, tp 3, 1,266 dispatch traces) renders to 21 KB.

The fields read (all optional; what is missing is shown as missing):

- ``manifest``, ``repository``, ``tag`` (``{"version", "digest"}``), ``topology`` (``{"tp", "ep", "pp"}``),
  ``plan_digest``, ``runtime`` (``{"activations", "float32"}``: the operators' activation dtype and which
  ran float32 instead), ``created``, ``passed``;
- ``parity``: a list of ``{"level", "name", "passed", "status", "value", "tolerance", "tolerance_source",
  "detail"}`` (``status`` "pass", "fail", "not applicable" or "not run"; without one, ``passed`` True,
  False or None says pass, fail or not run; a non-finite measure as the text ``"NaN"`` / ``"Infinity"``,
  shown as such; the charts draw it as nothing and list it by name);
- ``parity_l3``/``ladders`` and ``parity_l4`` (``reference``, ``per_position_abs_diff``, ...): the charts'
  data, see :mod:`.report_charts`;
- ``ladder``: the ladder's budget and coverage (``{"mode", "operators", "full", "sampled", "classes",
  "uncovered", "orphans", "failed_representatives"}``, each class ``{"rank", "kernel", "representative",
  "represents", "covered"}``);
- ``dispatch``: a list of ``{"rank", "weight", "phase", "kernel", "transformation", "activations",
  "path", "candidates"}`` (``path``: ``slow`` where the kernel runs its unvectorised path for the
  dtype); ``dispatch_summary``, when there, shown as a table as it comes;
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

from .report_charts import chart, l3_slots, l4_slots
from .report_views import (
    candidate_table,
    compact_names,
    dispatch_detail,
    esc,
    fmt,
    items,
    kernel_mix,
    mapping,
    rows_of,
    table,
)

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #1b1f24; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
table { border-collapse: collapse; margin: 8px 0; }
td, th { border: 1px solid #c9d1d9; padding: 3px 8px; text-align: left; font-size: 13px; }
th { background: #f3f5f7; }
.pass { color: #116329; font-weight: 600; } .fail { color: #b42318; font-weight: 600; }
.meta td:first-child { font-weight: 600; } svg text { font: 11px system-ui, sans-serif; }
.na { color: #57606a; } .note { color: #57606a; font-size: 12px; margin: 2px 0; }
.verdict { padding: 2px 10px; border-radius: 4px; color: #fff; margin-right: 6px; }
.verdict.pass { background: #116329; } .verdict.fail { background: #b42318; }
.verdict.na { background: #57606a; }
.levels td { border: none; padding: 2px 8px; } details { margin: 8px 0; } summary { cursor: pointer; }
.grid td, .legend td { font: 12px ui-monospace, monospace; padding: 1px 6px; }
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
    if isinstance(value, Mapping) and value and all(isinstance(v, (int, str)) for v in value.values()):
        return "<td>" + html.escape(" ".join(f"{k}={v}" for k, v in value.items())) + "</td>"
    if isinstance(value, (dict, list)):
        return f"<td><code>{html.escape(_short(json.dumps(value, sort_keys=True)))}</code></td>"
    return f"<td>{html.escape(str(value))}</td>"


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + f"… ({len(text)} characters)"


def _table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], empty: str) -> str:
    if not rows:
        return f"<p>{html.escape(empty)}</p>"
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(_cell(r.get(c)) for c in columns) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


#: What the inline script draws from (and the verdict, for a reader of the page's data): not the whole
#: predicate, whose dispatch traces and weight lists would make a 135M model's page ~500 KB.
_EMBEDDED = ("passed", "repository", "manifest", "tag", "topology", "plan_digest", "created",
             "timeline", "ledger", "memory", "devices")  # fmt: skip


def _script_json(data: Mapping[str, Any]) -> str:
    """JSON safe inside a ``<script>`` element: no ``</script>``, no HTML-significant characters.

    Strict JSON (``JSON.parse`` takes no NaN): a non-finite number is written as text, as the
    evidence writes it (:func:`shardport.provenance.canonical.finite_text`).
    """
    text = json.dumps(finite_text(data), sort_keys=True, default=str, allow_nan=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def status(row: Mapping[str, Any]) -> str:
    """A parity row's status: its ``status`` when it says one, else from ``passed`` (None: not run)."""
    said = row.get("status")
    if said in ("pass", "fail", "not applicable", "not run"):
        return str(said)
    passed = row.get("passed")
    return "not run" if passed is None else "pass" if passed is True else "fail"


def _badge(state: str) -> str:
    cls = {"pass": "pass", "fail": "fail"}.get(state, "na")
    return f'<td class="{cls}">{html.escape(state if state != "fail" else "FAIL")}</td>'


def _against(row: Mapping[str, Any]) -> str:
    """``value 1.2e-07 vs tolerance 1e-05 (source)``: what decided the row."""
    text = f"{row.get('name', '?')}: {fmt(row.get('value'))}"
    if row.get("tolerance") is not None:
        text += f" vs tolerance {fmt(row.get('tolerance'))}"
    if row.get("tolerance_source"):
        text += f" ({row['tolerance_source']})"
    return text


def level_lines(parity: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, str]]:
    """One (level, status, line) per level L0-L5; the line names the deciding check.

    A level fails if any of its checks failed, passes if any passed (the others not applicable or not
    run), else is not applicable (all of them) or not run.
    """
    out: list[tuple[str, str, str]] = []
    for level in ("L0", "L1", "L2", "L3", "L4", "L5"):
        rows = [r for r in parity if r.get("level") == level]
        states = [status(r) for r in rows]
        if not rows:
            out.append((level, "not run", "no checks in this evidence"))
            continue
        state: str = next((s for s in ("fail", "pass") if s in states), "")
        state = state or ("not applicable" if set(states) == {"not applicable"} else "not run")
        if state == "fail":
            decided = [r for r, s in zip(rows, states, strict=True) if s == "fail"]
        else:
            decided = [r for r in rows if r.get("tolerance") is not None] or rows
        count = f"{states.count('pass')} of {len(rows)} checks pass"
        line = f"{count}; {_against(decided[0])}"
        if state in ("not run", "not applicable"):
            line = f"{count}; {decided[0].get('detail') or decided[0].get('name')}"
        if len(decided) > 1 and state == "fail":
            line += f" (and {len(decided) - 1} more failing)"
        out.append((level, state, line))
    return out


def _topology_order(key: str) -> tuple[int, str]:
    return (("tp", "ep", "pp").index(key) if key in ("tp", "ep", "pp") else 3, key)


def _verdict(evidence: Mapping[str, Any]) -> list[str]:
    """The verdict banner and the one line per level."""
    passed = evidence.get("passed")
    word, cls = (
        ("PASSED", "pass")
        if passed is True
        else ("FAILED", "fail")
        if passed is False
        else ("NO VERDICT", "na")
    )
    tag, topo = mapping(evidence.get("tag")), mapping(evidence.get("topology"))
    meta = [
        (
            "model",
            f"{evidence.get('repository', '-')}"
            + (f" (tag version {tag['version']})" if tag.get("version") else ""),
        ),
        ("manifest", evidence.get("manifest")),
        ("topology", " ".join(f"{k}={topo[k]}" for k in sorted(topo, key=_topology_order)) or None),
        ("activations", _activations(evidence.get("runtime"))),
        ("plan", _plan(evidence)),
        ("created", evidence.get("created")),
    ]
    levels = "".join(
        f"<tr><td><b>{lv}</b></td>{_badge(state)}<td>{html.escape(line)}</td></tr>"
        for lv, state, line in level_lines(rows_of(evidence.get("parity")))
    )
    return [
        f'<h1><span class="verdict {cls}">{word}</span> shardport bring-up of '
        f"{html.escape(str(evidence.get('repository', '?')))}</h1>",
        '<table class="meta">'
        + "".join(f"<tr><td>{k}</td>{_cell(v)}</tr>" for k, v in meta if v)
        + "</table>",
        f'<table class="levels">{levels}</table>',
    ]


def _charts(evidence: Mapping[str, Any]) -> list[str]:
    """L3 E_kernel per layer and L4 |Δ| per position, static SVG."""
    l3 = l3_slots(evidence)
    parity = mapping(evidence.get("parity_l4"))
    l4, per_position = l4_slots(parity)
    ref = parity.get("reference") or evidence.get("reference")
    ref_text = (
        (" ".join(f"{k}={v}" for k, v in ref.items()) if isinstance(ref, Mapping) else str(ref))
        if ref
        else ""
    )
    l4_note = ("" if per_position or not l4 else
               " Only the maxima are in this evidence (no parity_l4.per_position_abs_diff).")  # fmt: skip
    return [
        "<h2>L3: operator error per layer</h2>",
        "<p>The largest relative operator error (E_kernel, log scale) of each layer's operators, with the "
        f"layer's tightest tolerance.{html.escape(_l3_scope(l3, evidence.get('ladder')))}</p>",
        chart(l3, log=True, name="l3", unit="max E_kernel per layer"),
        "<h2>L4: logits |Δ| per position</h2>",
        f"<p>|Δ| of the logits against the reference{html.escape(' (' + ref_text + ')' if ref_text else '')}"
        " per prompt position (blue) and decode step (orange), log scale; the tolerance as ticks."
        f"{html.escape(l4_note)}</p>",
        chart(l4, log=True, name="l4", unit="max |Δ| per position"),
    ]


def _l3_scope(slots: Sequence[Any], ladder: Any) -> str:
    """How many operators the L3 chart covers, of how many (sampled ones are proved by representatives)."""
    if not slots:
        return " No per-operator L3 records in this evidence (parity_l3)."
    ran = sum(s.count for s in slots)
    total = ladder.get("operators") if isinstance(ladder, Mapping) else None
    if not isinstance(total, int) or ran >= total:
        return f" {ran} operators."
    return (
        f" {ran} of {total} operators ran L3 (--ladder {ladder.get('mode')}: the class representatives;"
        " each covers the weights of its class, see Ladder coverage)."
    )


def _coverage(ladder: Any, values: Any = None) -> list[str]:
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
    classes = [c for c in rows_of(ladder.get("classes")) if c.get("represents")]
    rows = [
        [esc(c.get("rank")), esc(c.get("kernel")), f"<code>{esc(c.get('representative'))}</code>",
         esc(c.get("represents")), esc(compact_names(str(w) for w in items(c.get("covered"))))]
        for c in classes
    ]  # fmt: skip
    parts = ["<h2>Ladder coverage</h2>", f"<p>{html.escape(summary)}</p>"]
    if isinstance(values, Mapping) and values.get("sha256"):
        where = f", attached as {values['blob']}" if values.get("blob") else ""
        said = f"Per-operator ladder values: {values.get('operators')} operators, {values['sha256']}{where}."
        parts.append(f"<p>{html.escape(said)}</p>")
    for key, what in (("uncovered", "no ladder"), ("orphans", "no representative"),
                      ("failed_representatives", "representative failed")):  # fmt: skip
        names = [str(x) for x in items(ladder.get(key))]
        if names:
            parts.append(f'<p class="fail">{len(names)} {what}: {html.escape("; ".join(names[:5]))}'
                         + ("; …" if len(names) > 5 else "") + "</p>")  # fmt: skip
    if not rows:
        parts.append(f"<p>{'every operator ran the full ladder' if mode != 'off' else 'no ladder ran'}</p>")
        return parts
    head = ["rank", "kernel", "representative", "represents", "covered"]
    parts.append(f"<details><summary>{len(rows)} ladder classes (representative and the weights it "
                 f"covers)</summary>{table(rows, head)}</details>")  # fmt: skip
    return parts


def _as_table(value: Any, what: str) -> list[str]:
    """A field of a shape this page does not know beyond "rows": a small table, as it comes."""
    if isinstance(value, Mapping) and value:
        return [f"<p>{html.escape(what)}:</p>", _table([value], list(value), "")]
    if isinstance(value, list) and value and all(isinstance(r, Mapping) for r in value):
        return [
            f"<p>{html.escape(what)}:</p>",
            _table(value, list(dict.fromkeys(k for r in value for k in r)), ""),
        ]
    return []


def _dispatch(evidence: Mapping[str, Any]) -> list[str]:
    """The kernel mix per rank and weight class; every trace behind a collapsed ``<details>``."""
    dispatch = rows_of(evidence.get("dispatch"))
    groups = rows_of(evidence.get("dispatch_candidates"))
    parts = ["<h2>Dispatch</h2>", *_as_table(evidence.get("dispatch_summary"), "Summary")]
    if groups:
        said = "<p>The candidates per weight representation (ranks and phases that agree are one row):</p>"
        parts += [said, candidate_table(groups)]
    parts += _as_table(evidence.get("conversion_errors"), "Largest recorded conversion error")
    if not dispatch:
        return [*parts, "<p>no dispatch trace" + " list in this evidence" * (len(parts) > 1) + "</p>"]
    ranks = len({str(r.get("rank")) for r in dispatch})
    parts += [
        f"<p>{len(dispatch)} traces on {ranks} ranks: the kernel mix per rank and weight class.</p>",
        kernel_mix(dispatch),
        f"<details><summary>every trace ({len(dispatch)}), by rank and layer</summary>"
        f"{dispatch_detail(dispatch)}</details>",
    ]
    return parts


def _plan(evidence: Mapping[str, Any]) -> str | None:
    """The placement plan's digest (``plan_digest``, or ``placement``'s), and whether the ranks agree."""
    place = mapping(evidence.get("placement"))
    digest = evidence.get("plan_digest") or place.get("plan_sha256") or place.get("digest")
    if not digest and not place:
        return None
    text = str(digest or "-")
    if place.get("decisions"):
        text += f"; decisions {place['decisions']}"
    if "agree" in place:
        text += "; every rank's plan agrees" if place["agree"] is True else "; the ranks' plans DISAGREE"
    for node in items(place.get("nodes")):
        where = mapping(node)
        text += (
            f"; node {where.get('address') or where.get('node')!s}: ranks {where.get('ranks')}, "
            f"{where.get('reads')} read(s), amplification {float(where.get('read_amplification', 0.0)):.2f}"
        )
    return text


def _activations(runtime: Any) -> str | None:
    """The runtime's activation dtype, with the operators that ran float32 instead (if any)."""
    if not isinstance(runtime, Mapping):
        return None
    asked = str(runtime.get("activations"))
    resolved = sorted({str(v) for v in mapping(runtime.get("ranks")).values()})
    if asked == "auto" and resolved:
        asked = f"auto ({', '.join(resolved)})"
    other = [str(x) for x in items(runtime.get("float32"))]
    if not other:
        return asked
    return f"{asked}; {len(other)} operators ran float32: {'; '.join(other[:3])}"


def render_report(evidence: Mapping[str, Any]) -> str:
    """The page for one bring-up's evidence predicate."""
    parity = [{**r, "status": status(r)} for r in rows_of(evidence.get("parity"))]
    columns = ["level", "name", "status", "value", "tolerance"]
    columns += ["tolerance_source"] * any(r.get("tolerance_source") for r in parity) + ["detail"]
    embedded = {k: evidence[k] for k in _EMBEDDED if k in evidence}
    for key in ("timeline", "ledger", "memory"):  # the script draws {rank: {part: number}} only
        if key in embedded:
            embedded[key] = {str(r): v for r, v in mapping(embedded[key]).items() if isinstance(v, Mapping)}
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8"><title>shardport bring-up evidence</title>',
        f"<style>{_STYLE}</style></head><body>",
        *_verdict(evidence),
        *_charts(evidence),
        "<h2>Parity checks</h2>",
        _table(parity, columns, "no parity results"),
        *_coverage(evidence.get("ladder"), evidence.get("ladder_values")),
        *_dispatch(evidence),
        "<h2>Startup timeline per rank (seconds)</h2>",
        '<div id="timeline"></div>',
        "<h2>Memory per rank</h2>",
        "<p>What the rank's memory is made of (component ledger):</p>",
        '<div id="memory"></div>',
        "<p>Bytes on disk, fetched, host and device resident, repack workspace peak:</p>",
        '<div id="measures"></div>',
        f'<script type="application/json" id="evidence-data">{_script_json(embedded)}</script>',
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
