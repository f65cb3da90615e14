"""`quantkit bench calibration-match`: does calibrating on a mix matched to traffic pay off after INT4?

A traffic-like set is split (seeded) into a traffic sample, which is all `--dataset auto` sees, and a held-out
part. GPTQ and AWQ (g64) are calibrated on (a) the auto mix for that traffic sample, (b) the best single
candidate by the same measures, (c) a mismatched real set and (d) the old synthetic default, with the same
sample count and length. Every checkpoint goes through `quantkit eval` against fp16: perplexity and KL on the
held-out part, accuracy on one standard task (arc_easy), so each number is what the eval command reports.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import torch
import yaml

from quantkit.data.records import Record

METHODS = ("gptq-w4a16-g64", "awq-w4a16-g64")
DEFAULT_TRAFFIC = "code_python_en:eval,coqa_chat_en:eval"  # a service taking coding and conversational QA
MISMATCHED = "medqa_clinical_en"
SYNTHETIC_DEFAULT = "support_chat_en"  # what `make demo` calibrated on before the real sets
TASK, TASK_ITEMS = "arc_easy", 120  # the quick suite's size; the quick gate's 10-point margin resolves at 120


def split_traffic(records: list[Record], seed: int) -> tuple[list[Record], list[Record]]:
    """Half the records (seeded shuffle) as the traffic sample, the other half held out."""
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    half = len(order) // 2
    return [records[i] for i in order[:half]], [records[i] for i in order[half:]]


def write_records(records: list[Record], path: Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            fields = ({"messages": [{"role": role, "content": c} for role, c in r.messages]} if r.shape == "chat" else
                      {"prompt": r.prompt, "completion": r.completion} if r.shape == "pair" else {"text": r.text})
            f.write(json.dumps(fields | {"task": r.task, "lang": r.lang}, ensure_ascii=False) + "\n")


def write_suite(held_out: Path, records: int, max_seq_len: int, path: Path) -> None:
    suite = {"name": "calibration-match", "description": "held-out traffic and one standard task",
             "token_metrics": {"datasets": [str(held_out)], "max_seq_len": max_seq_len, "records": records},
             "layer_metrics": {"dataset": str(held_out), "num_samples": 2, "max_seq_len": 64},
             "tasks": {TASK: TASK_ITEMS},
             "task_power": {"discordance": 0.15, "power": 0.8, "basis": "as in the quick suite"},
             "bootstrap": {"resamples": 1000, "confidence": 0.95, "seed": 0}}
    path.write_text(yaml.safe_dump(suite, sort_keys=False))


def calibrations(model_path: Path, traffic: list[Record], candidates: str, num_samples: int, max_seq_len: int,
                 seed: int) -> dict[str, tuple[list[list[int]], str]]:
    """Calibration name -> (token sequences, what they are)."""
    from quantkit.data.auto_mix import auto_samples
    from quantkit.data.readers import read_records
    from quantkit.data.samples import draw_samples, tokenize
    from quantkit.models import load_tokenizer

    tokenizer = load_tokenizer(model_path)
    auto = auto_samples(candidates, traffic, tokenize(traffic, tokenizer), tokenizer, num_samples, max_seq_len, seed)
    mix = ", ".join(f"{name} {n}" for name, n in auto.mix.counts.items() if n)
    out = {"(a) auto mix": (auto.samples.input_ids, mix)}
    for label, name in (("(b) best single set", auto.mix.best_single), ("(c) mismatched real set", MISMATCHED),
                        ("(d) old synthetic default", SYNTHETIC_DEFAULT)):
        drawn = draw_samples(read_records(name), tokenizer, num_samples, max_seq_len, seed=seed)
        out[label] = (drawn.input_ids, name)
    return out


def quantize_and_eval(model: str, recipe: str, samples: list[list[int]], work: Path, suite: Path) -> dict:
    from quantkit.calibration.run import save_samples
    from quantkit.eval.run import EvalOptions, run_eval
    from quantkit.quantize.run import QuantizeOptions, quantize

    calib, ckpt = work / "calib", work / "ckpt"
    calib.mkdir(parents=True, exist_ok=True)
    save_samples(samples, calib / "samples.safetensors")
    (calib / "manifest.json").write_text(json.dumps({"dataset": {"ref": "bench calibration-match"}}))
    started = time.perf_counter()
    quantize(QuantizeOptions(model=model, recipe=recipe, out=ckpt, calib=calib, overwrite=True))
    result = run_eval(EvalOptions(baseline=model, candidate=str(ckpt), report=work / "report", suite=str(suite),
                                  gates="quick", overwrite=True))
    row = {"seconds": round(time.perf_counter() - started, 1)}
    for m in result.measurements:
        if m.metric in ("perplexity_increase_pct", "kl_mean", "top1_agreement") and m.scope != "pooled":
            row[m.metric] = m.estimate.value
            row[f"{m.metric}_ci"] = (m.estimate.low, m.estimate.high)
        if m.metric == "accuracy_drop_points" and m.scope == TASK:
            row.update(task_baseline=m.baseline, task_candidate=m.candidate, task_drop=m.estimate.value)
    return row


def run_bench(model: str, traffic_ref: str, candidates: str, num_samples: int, max_seq_len: int, records: int,
              methods: list[str], threads: int, seed: int, work: Path, console) -> list[dict]:
    from quantkit.data.readers import read_records
    from quantkit.models import resolve_model

    torch.set_num_threads(threads)
    path = resolve_model(model)
    traffic, held_out = split_traffic(read_records(traffic_ref), seed)
    work.mkdir(parents=True, exist_ok=True)
    write_records(held_out, work / "held_out.jsonl")
    write_suite(work / "held_out.jsonl", min(records, len(held_out)), max_seq_len, work / "suite.yaml")
    rows = []
    for label, (samples, what) in calibrations(path, traffic, candidates, num_samples, max_seq_len, seed).items():
        for recipe in methods:
            row = {"calibration": label, "what": what, "recipe": recipe}
            row |= quantize_and_eval(model, recipe, samples, work / f"{recipe}-{label[1]}", work / "suite.yaml")
            rows.append(row)
            console.print(json.dumps(row), highlight=False, soft_wrap=True)
    print_table(rows, traffic_ref, len(traffic), min(records, len(held_out)), num_samples, max_seq_len, threads,
                console)
    return rows


def print_table(rows: list[dict], traffic_ref: str, n_traffic: int, n_held: int, num_samples: int,
                max_seq_len: int, threads: int, console) -> None:
    from rich.table import Table

    table = Table(title=f"calibration-match: traffic {traffic_ref} ({n_traffic} records seen, {n_held} held out), "
                        f"{num_samples} x <={max_seq_len} calibration tokens, {threads} thread(s)")
    for column in ("recipe", "calibration", "drawn from", "held-out ppl +%", "KL mean", "top-1 agree",
                   f"{TASK} acc (fp16)", f"{TASK} drop pts"):
        table.add_column(column)
    for r in rows:
        table.add_row(r["recipe"], r["calibration"], r["what"], f"{r['perplexity_increase_pct']:+.2f}",
                      f"{r['kl_mean']:.4f}", f"{r['top1_agreement']:.3f}",
                      f"{r['task_candidate']:.3f} ({r['task_baseline']:.3f})", f"{r['task_drop']:+.1f}")
    console.print(table, width=max(console.width, 160))
