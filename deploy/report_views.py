"""The report's grouped views: weight names by layer, the kernel mix, the dispatch grid, the two charts.

Pure functions from the evidence predicate's plain data to HTML text (:mod:`.report` assembles the
page). Every value taken from the data is escaped (:func:`html.escape`); the charts are static SVG
written here, so they need no script. A weight's *layer* is the first dot-delimited integer in its name
(``model.layers.12.mlp.up_proj.weight``, ``blk.3.attn_q.weight``); its *class* is the name with every
such integer written ``*`` (``model.layers.*.mlp.up_proj.weight``; a Mixtral expert's index folds too).
A name without one (embeddings, head, final norm) is its own class and has no layer.
"""

from __future__ import annotations

import html
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$|\[)|^\d+(?=\.)")


def esc(value: Any) -> str:
    """``value`` as HTML text."""
    return html.escape(str(value))


def mapping(value: Any) -> Mapping[str, Any]:
    """``value`` when it is a mapping, else an empty one (a field of another shape reads as missing)."""
    return value if isinstance(value, Mapping) else {}


def items(value: Any) -> list[Any]:
    """``value`` when it is a list, else an empty one."""
    return value if isinstance(value, list) else []


def rows_of(value: Any) -> list[Mapping[str, Any]]:
    """The mappings of a list (a row of another shape is left out), an empty list for anything else."""
    return [r for r in items(value) if isinstance(r, Mapping)]


def number(value: Any) -> float | None:
    """A measured value as a float, None for anything that is not a number (missing, a word, a bool).

    ``"NaN"``/``"Infinity"`` (the sealed evidence's text) read back as floats.
    """
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def fmt(value: Any) -> str:
    """A value for a table cell or a summary line: floats to 4 significant digits, None as ``-``."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def layer_of(weight: str) -> int | None:
    """The first dot-delimited integer in a weight's name (its layer), None without one."""
    found = _INDEX.search(weight)
    return int(found.group(0)) if found else None


def class_of(weight: str) -> str:
    """The weight's name with every dot-delimited integer written ``*``; a shard suffix ``[...]`` dropped."""
    return _INDEX.sub("*", weight.split("[")[0])


def part_of(weight: str) -> str:
    """What follows the layer index (``mlp.up_proj.weight``): a grid column; the whole name without one."""
    base = weight.split("[")[0]
    found = _INDEX.search(base)
    return _INDEX.sub("*", base[found.end() + 1 :]) if found else base


def ranges(values: Iterable[int]) -> str:
    """``0-3,5,7-9``: sorted integers as runs."""
    out: list[str] = []
    for v in sorted(set(values)):
        if out and out[-1].split("-")[-1] == str(v - 1):
            out[-1] = out[-1].split("-")[0] + f"-{v}"
        else:
            out.append(str(v))
    return ",".join(out)


def compact_names(names: Iterable[str]) -> str:
    """Weight names folded by layer: ``model.layers.{1-29}.mlp.up_proj.weight; lm_head.weight``."""
    groups: dict[str, list[int]] = {}
    plain: list[str] = []
    for name in names:
        found = _INDEX.search(name)
        if found is None:
            plain.append(name)
            continue
        key = name[: found.start()] + "{}" + name[found.end() :]
        groups.setdefault(key, []).append(int(found.group(0)))
    folded = [key.replace("{}", "{" + ranges(idx) + "}" if len(set(idx)) > 1 else str(idx[0]), 1)
              for key, idx in groups.items()]  # fmt: skip
    return "; ".join(folded + plain)


def mix(counter: Counter[str]) -> str:
    """``a ×60, b ×2``: a count per value, most first."""  # noqa: RUF002
    return ", ".join(f"{k} \u00d7{n}" for k, n in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0])))


def table(rows: Sequence[Sequence[str]], head: Sequence[str], cls: str = "") -> str:
    """An HTML table of already-escaped cells (``<td>`` added here unless a cell brings its own)."""
    attr = f' class="{cls}"' if cls else ""
    top = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(c if c.startswith("<td") else f"<td>{c}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table{attr}><tr>{top}</tr>{body}</table>"


# --- dispatch ---------------------------------------------------------------------------------------


def _candidates(row: Mapping[str, Any]) -> str:
    """A trace's candidates in a few words (``kernel: selected``, ``kernel: refused (reason, ...)``)."""
    out = []
    for c in items(row.get("candidates")):
        if not isinstance(c, Mapping):
            out.append(str(c))
            continue
        admission = mapping(c.get("admission"))
        accepted = c.get("accepted", admission.get("accepted"))
        reasons = items(c.get("reasons")) or [
            r.get("reason") if isinstance(r, Mapping) else r for r in items(admission.get("refusals"))
        ]
        said = "selected" if c.get("selected") else "admitted" if accepted else "refused"
        extra = [str(r) for r in reasons if r] + ([str(c["note"])] if c.get("note") else [])
        out.append(f"{c.get('kernel', '?')}: {said}" + (f" ({', '.join(extra)})" if extra else ""))
    return "; ".join(out)


def _way(row: Mapping[str, Any]) -> tuple[str, ...]:
    """What a trace did, as one key of the dispatch legend."""
    return (
        str(row.get("kernel", "-")),
        str(row.get("transformation", "-")),
        str(row.get("activations") or "-"),
        str(row.get("path") or "-"),
        _candidates(row),
    )


def kernel_mix(dispatch: Sequence[Mapping[str, Any]]) -> str:
    """Per rank and weight class: how many weights and traces, and the kernels, transformations, paths.

    Ranks whose row for a class says the same are one row (``0-2``); a slow path is marked.
    """
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for row in dispatch:
        groups.setdefault((str(row.get("rank")), class_of(str(row.get("weight", "")))), []).append(row)
    same: dict[tuple[str, ...], list[str]] = {}
    for (rank, cls), traces in sorted(groups.items(), key=lambda kv: (kv[0][1], _rank_key(kv[0][0]))):
        key = (
            cls,
            str(len({str(t.get("weight")) for t in traces})),
            str(len(traces)),
            mix(Counter(str(t.get("kernel")) for t in traces)),
            mix(Counter(str(t.get("transformation")) for t in traces)),
            mix(Counter(str(t.get("activations") or "-") for t in traces)),
            mix(Counter(str(t.get("path") or "-") for t in traces)),
        )
        same.setdefault(key, []).append(rank)
    rows = [
        [esc(_ranks(ranks)), f"<code>{esc(key[0])}</code>", *(esc(k) for k in key[1:6]),
         ('<td class="fail">' if "slow" in key[6] else "<td>") + f"{esc(key[6])}</td>"]
        for key, ranks in sorted(same.items(), key=lambda kv: (kv[0][0], _rank_key(kv[1][0])))
    ]  # fmt: skip
    head = ["ranks", "weight class", "weights per rank", "traces per rank", "kernel", "transformation"]
    return table(rows, [*head, "activations", "path"])


def _ranks(ranks: Sequence[str]) -> str:
    numbers = [int(r) for r in ranks if r.isdigit()]
    return ",".join([ranges(numbers)] * bool(numbers) + [r for r in ranks if not r.isdigit()])


def candidate_table(groups: Sequence[Mapping[str, Any]]) -> str:
    """``dispatch_candidates`` as a table, rows that agree folded.

    Each group: per rank, weight class and phase, the weights, the selected kernels and every
    candidate's admitted/prepared/selected counts and refusal reasons.
    """
    same: dict[tuple[str, ...], list[tuple[str, str]]] = {}
    for g in groups:
        picked = mapping(g.get("selected"))
        said = []
        for c in items(g.get("candidates")):
            c = mapping(c)
            counts = ", ".join(f"{k} {c[k]}" for k in ("admitted", "prepared", "selected") if k in c)
            why = "; ".join(str(r) for r in items(c.get("reasons")))
            said.append(f"{c.get('kernel', '?')}: {counts}" + (f" (refused: {why})" if why else ""))
        key = (
            str(g.get("weight_class", "-")),
            str(g.get("weights", "-")),
            mix(Counter({str(k): int(v) for k, v in picked.items() if isinstance(v, int)})),
            ", ".join(str(a) for a in items(g.get("activations"))),
            " | ".join(said),
        )
        same.setdefault(key, []).append((str(g.get("rank")), str(g.get("phase", "-"))))
    rows = [
        [esc(_ranks(list(dict.fromkeys(r for r, _ in where)))),
         esc(", ".join(dict.fromkeys(p for _, p in where))), f"<code>{esc(key[0])}</code>",
         *(esc(k) for k in key[1:])]
        for key, where in same.items()
    ]  # fmt: skip
    return table(
        rows, ["ranks", "phases", "weight class", "weights", "selected", "activations", "candidates"]
    )


def _rank_key(rank: str) -> tuple[int, str]:
    return (int(rank), "") if rank.isdigit() else (1 << 30, rank)


def dispatch_detail(dispatch: Sequence[Mapping[str, Any]]) -> str:
    """Every trace, compactly: a legend of what the traces did (one letter each), then a grid per rank.

    The grid's rows are layers (consecutive ones with the same cells folded), its columns the weights'
    parts, its cells the letter per phase; weights without a layer are listed apart.
    """
    legend: dict[tuple[str, ...], str] = {}
    counts: Counter[str] = Counter()
    phases = list(dict.fromkeys(str(r.get("phase", "-")) for r in dispatch))
    cells: dict[str, dict[tuple[int | None, str], dict[str, set[str]]]] = {}
    for row in dispatch:
        code = legend.setdefault(_way(row), _letter(len(legend)))
        counts[code] += 1
        weight = str(row.get("weight", ""))
        layer = layer_of(weight)
        spot = (layer, part_of(weight) if layer is not None else weight.split("[")[0])
        per_phase = cells.setdefault(str(row.get("rank")), {}).setdefault(spot, {})
        per_phase.setdefault(str(row.get("phase", "-")), set()).add(code)
    legend_rows = [
        [f"<b>{code}</b>", *(esc(v) for v in way[:3]),
         f'<td class="fail">{esc(way[3])}</td>' if way[3] == "slow" else esc(way[3]), str(counts[code]),
         esc(way[4]) or "-"]
        for way, code in legend.items()
    ]  # fmt: skip
    head = ["", "kernel", "transformation", "activations", "path", "traces", "candidates"]
    parts = [
        f"<p>Cells give the letter per phase ({esc(' / '.join(phases))}).</p>",
        table(legend_rows, head, "legend"),
    ]
    for rank in sorted(cells, key=_rank_key):
        parts.append(f"<h4>rank {esc(rank)}</h4>" + _grid(cells[rank], phases))
    return "".join(parts)


def _letter(i: int) -> str:
    """A, B, ..., Z, AA, AB, ...: the legend's codes."""
    return ("" if i < 26 else _letter(i // 26 - 1)) + chr(ord("A") + i % 26)


def _cell_text(per_phase: Mapping[str, set[str]], phases: Sequence[str]) -> str:
    texts = [",".join(sorted(per_phase.get(p, set()))) or "-" for p in phases]
    return texts[0] if len(set(texts)) == 1 else "/".join(texts)


def _grid(cells: Mapping[tuple[int | None, str], Mapping[str, set[str]]], phases: Sequence[str]) -> str:
    columns = list(dict.fromkeys(part for layer, part in cells if layer is not None))
    layers = sorted({layer for layer, _ in cells if layer is not None})
    rows: list[tuple[int, int, list[str]]] = []  # consecutive layers with identical cells folded
    for layer in layers:
        texts = [_cell_text(cells[(layer, c)], phases) if (layer, c) in cells else "" for c in columns]
        if rows and rows[-1][2] == texts and rows[-1][1] == layer - 1:
            rows[-1] = (rows[-1][0], layer, texts)
        else:
            rows.append((layer, layer, texts))
    shown = [[str(a) if a == b else f"{a}-{b}", *texts] for a, b, texts in rows]
    head = ["layer", *(c.removesuffix(".weight") for c in columns)]
    out = table([[esc(c) for c in r] for r in shown], head, "grid") if rows else ""
    plain = [
        [esc(part), esc(_cell_text(cells[(None, part)], phases))] for layer, part in cells if layer is None
    ]
    return out + (table(plain, ["weight", "traces"], "grid") if plain else "")
