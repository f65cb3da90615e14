"""Write an eval result: report.json (stable schema), report.md (a pull request comment), PNG plots and
junit.xml (one test case per gate, so CI systems show each gate)."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from quantkit.eval.gates import GateResult, is_gated
from quantkit.eval.stats import Measurement

SCHEMA = "quantkit.eval.report/1"
DELTA_LABEL = {"perplexity_increase_pct": "% increase", "kl_mean": "KL", "kl_p99": "KL p99",
               "top1_agreement": "agreement", "accuracy_drop_points": "drop (pts)",
               "attention_shift_max": "JS max", "layer_sqnr_min_db": "dB min"}


@dataclass
class EvalResult:
    header: dict  # baseline, candidate, suite, gates, limit, cached, wall time
    measurements: list[Measurement]
    gates: list[GateResult]
    layers: dict[str, list[float]]  # sqnr_db, attention_js per layer
    kl_per_token: np.ndarray

    @property
    def passed(self) -> bool:
        return all(g.passed for g in self.gates)


def _num(x):
    """JSON numbers: non-finite values as strings ('inf', '-inf') or null (nan)."""
    if x is None:
        return None
    x = float(x)
    if math.isnan(x):
        return None
    return x if math.isfinite(x) else ("inf" if x > 0 else "-inf")


def fmt(x, digits: int = 4) -> str:
    if x is None:
        return "-"
    return "inf" if x == math.inf else f"{x:.{digits}g}"


def table_rows(result: EvalResult, per_dataset: tuple[str, ...] | None = None) -> list[list[str]]:
    """metric, scope, baseline, candidate, delta, CI, n, gate, result: shared by the CLI and report.md.
    ``per_dataset``: the metrics to show where no gate applies to the row (default: every row)."""
    gates = {(g.metric, g.scope): g for g in result.gates if not g.skipped}
    rows = []
    for m in result.measurements:
        e, gate = m.estimate, gates.get((m.metric, m.scope))
        if per_dataset is not None and gate is None and m.metric not in per_dataset:
            continue
        ci = f"[{fmt(e.low)}, {fmt(e.high)}]" if e.low is not None else "-"
        n = f"{e.n} {m.units}" + (f" / {m.tokens:,} tok" if m.tokens else "")
        rows.append([m.metric, m.scope, fmt(m.baseline), fmt(m.candidate), f"{fmt(e.value)} {DELTA_LABEL.get(m.metric, '')}".strip(),
                     ci, n, gate.describe() if gate else "-", ("PASS" if gate.passed else "FAIL") if gate else ""])
    for g in result.gates:
        if g.skipped:
            rows.append([g.metric, "-", "-", "-", "-", "-", "-", g.describe(), "SKIPPED (not measured)"])
    return rows


COLUMNS = ["metric", "scope", "baseline", "candidate", "delta", "CI", "n", "gate", "result"]


def write_report(result: EvalResult, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(to_json(result), indent=2) + "\n")
    (out / "report.md").write_text(to_markdown(result))
    (out / "junit.xml").write_bytes(to_junit(result))
    plot_layers(result.layers, out / "layers.png")
    plot_kl_histogram(result.kl_per_token, out / "kl_histogram.png")


def to_json(result: EvalResult) -> dict:
    confidence = result.header.get("confidence")
    return {
        "schema": SCHEMA,
        **result.header,
        "passed": result.passed,
        "measurements": [{
            "metric": m.metric, "scope": m.scope, "gated": is_gated(m), "baseline": _num(m.baseline),
            "candidate": _num(m.candidate), "value": _num(m.estimate.value), "ci_low": _num(m.estimate.low),
            "ci_high": _num(m.estimate.high), "confidence": confidence, "n": m.estimate.n, "units": m.units,
            "tokens": m.tokens, **({"details": {k: _num(v) if isinstance(v, float) else v
                                                for k, v in m.details.items()}} if m.details else {})}
            for m in result.measurements],
        "gates": [{
            "metric": g.metric, "scope": g.scope, "bound": g.bound, "threshold": g.limit,
            "fail_when": g.threshold.fail_when, "compared": _num(g.compared), "passed": g.passed,
            "skipped": g.skipped} for g in result.gates],
        "layers": {k: [_num(v) for v in values] for k, values in result.layers.items()},
    }


def to_markdown(result: EvalResult) -> str:
    h = result.header
    failed = [g for g in result.gates if not g.passed]
    verdict = "PASS" if not failed else f"FAIL ({len(failed)} of {len(result.gates)} gates)"
    lines = [f"## quantkit eval: {verdict}", "",
             f"- baseline: `{h['baseline']['ref']}`" + (" (cached)" if h.get("baseline_cached") else ""),
             f"- candidate: `{h['candidate']['ref']}`",
             f"- suite: `{h['suite']['name']}`, gates: `{h['gates']['name']}`, limit: {h.get('limit') or 'none'}, "
             f"{round(100 * h['confidence'])}% paired bootstrap intervals ({h['resamples']} resamples)",
             f"- sample sizes: {h['sample_sizes']}", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in table_rows(result)]
    tasks = task_lines(result)
    if tasks:
        lines += ["", "Tasks:", ""] + [f"- {line}" for line in tasks]
    lines += ["", "Plots: `layers.png` (per-layer SQNR and attention shift), `kl_histogram.png`.", ""]
    return "\n".join(lines)


def task_lines(result: EvalResult) -> list[str]:
    """Per task: its chance level, whether it can show a regression, and what its item count resolves."""
    lines = []
    for m in result.measurements:
        d = m.details
        if m.metric != "accuracy_drop_points" or not d:
            continue
        chance = "chance " + " / majority ".join(f"{x:.0%}" for x in (d["chance"], d["majority"]) if x is not None)
        low = f" (95% low {d['baseline_low']:.1%})" if d.get("baseline_low") is not None else ""
        verdict = ("gated" if d["above_chance"] else
                   "NOT GATED: cannot show a regression (baseline not clearly above chance)")
        discordance = f"{d['discordance']:.3f}" if d.get("discordance") is not None else "-"
        lines.append(f"{m.scope}: {m.estimate.n} items, baseline {m.baseline:.1%}{low}, "
                     f"{chance if d['chance'] is not None else 'chance level unknown'}; {verdict}; "
                     f"resolves drops of {d['minimum_detectable_drop']:.1f} points; discordance {discordance}")
    return lines


def to_junit(result: EvalResult) -> bytes:
    failures = sum(not g.passed for g in result.gates)
    skipped = sum(g.skipped for g in result.gates)
    suite = ET.Element("testsuite", name="quantkit eval gates", tests=str(len(result.gates)),
                       failures=str(failures), errors="0", skipped=str(skipped))
    for g in result.gates:
        case = ET.SubElement(suite, "testcase", classname=f"quantkit.eval.{result.header['gates']['name']}",
                             name=f"{g.metric}[{g.scope}]")
        if g.skipped:
            ET.SubElement(case, "skipped", message="the suite does not measure this metric")
        elif not g.passed:
            m = g.measurement
            message = (f"{g.metric} on {g.scope}: {fmt(m.estimate.value)} "
                       f"(CI [{fmt(m.estimate.low)}, {fmt(m.estimate.high)}]), required {g.describe()}")
            ET.SubElement(case, "failure", message=message, type="GateFailed").text = message
    root = ET.Element("testsuites", tests=str(len(result.gates)), failures=str(failures))
    root.append(suite)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_layers(layers: dict[str, list[float]], path: Path) -> None:
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    sqnr = np.array(layers.get("sqnr_db", []), dtype=float)
    if len(sqnr):
        finite = np.where(np.isfinite(sqnr), sqnr, np.nan)
        top.plot(range(len(sqnr)), finite, marker="o")
    top.set_ylabel("output SQNR (dB)")
    top.set_title("per decoder layer: candidate vs baseline")
    js = layers.get("attention_js", [])
    bottom.bar(range(len(js)), js)
    bottom.set_ylabel("attention JS divergence (nats)")
    bottom.set_xlabel("layer")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_kl_histogram(kl: np.ndarray, path: Path) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    if len(kl):
        ax.hist(kl, bins=50, log=True)
    ax.set_xlabel("per-token KL(baseline || candidate), nats")
    ax.set_ylabel("tokens")
    ax.set_title(f"{len(kl):,} tokens, mean {kl.mean() if len(kl) else 0:.4g}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
