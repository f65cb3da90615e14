"""`quantkit bench gate`: a ladder of candidates with known regressions, each measured by `quantkit eval`
against the fp16 baseline, to show which ones the eval gate catches (issue 41).

The ladder: the baseline itself (every delta must come out exactly 0); FP8 W8A8, GPTQ and RTN INT4 through
the real quantize pipeline; RTN at 3 and 2 bits on every decoder linear; two single-tensor breaks (one
layer's down_proj at 2 bits, one layer's v_proj 25% off). The packed formats hold only 2, 4 or 8 bits, so
the 3-bit row and the breaks are dense copies of the model with fake-quantized (or scaled) weights, in the
model's own dtype and config.

Candidates live in <out>/candidates/<name>, each written atomically with a record of what built it; a rerun
reuses a candidate whose record matches and only re-evaluates.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import torch

from quantkit.algorithms.rtn import WeightScheme, fake_quantize
from quantkit.errors import QuantkitError
from quantkit.eval.gates import POOLED, TOKEN_METRICS
from quantkit.outdir import atomic_output_dir

GROUP_SIZE = 64  # fits every SmolLM2 linear (576 and 1536 inputs); 128 does not
# What the ladder calibrates GPTQ on: the synthetic support chat `make demo` used when the ladder in
# docs/evaluation.md was measured (the demo now takes real text, wiki_rag_en). quantize's --dataset path draws
# the same samples as `quantkit calibrate` (same sampler and seed) without the statistics GPTQ does not read.
CALIB_DATASET, CALIB_SAMPLES, CALIB_SEQ_LEN = "support_chat_en", 32, 512
BUILD_RECORD = "gate-candidate.json"  # written last: a candidate directory that holds it is complete
TASK_METRICS = ("accuracy_drop_points",)
MAX_LISTED = 3  # failed gates named per kind in the table
COLUMNS = ("candidate", "ppl +%", "KL mean", "top-1 agree", "worst task drop pts (CI high)", "gates failed",
           "failed gates", "result", "build s", "eval s")


@dataclass(frozen=True)
class BuildSpec:
    """What the candidates are built from."""
    base_dir: Path
    layer: int  # the decoder layer the break-* candidates change
    calib: Path | None  # GPTQ's calibration (a `quantkit calibrate` output); None: CALIB_DATASET


Build = Callable[[BuildSpec, Path], dict]  # (spec, empty directory) -> details for the build record
TensorEdit = Callable[[str, torch.Tensor, BuildSpec], Optional[torch.Tensor]]  # None: keep the tensor


@dataclass(frozen=True)
class Candidate:
    name: str
    claim: str  # what it changes, in words
    build: Build | None  # None: the baseline directory itself
    uses: tuple[str, ...] = ()  # BuildSpec fields its build depends on besides the base model

    def key(self, spec: BuildSpec) -> dict:
        """What must match for an existing build to be reused."""
        return {"base_dir": str(spec.base_dir), **{name: str(getattr(spec, name)) for name in self.uses}}


# ---- building -------------------------------------------------------------------------------------------

def is_decoder_linear(name: str, tensor: torch.Tensor) -> bool:
    """Linear weights inside decoder layers (norms are 1-D; embeddings and lm_head sit outside the layers)."""
    return ".layers." in name and name.endswith(".weight") and tensor.ndim == 2


def group_fake_quantize(name: str, tensor: torch.Tensor, bits: int) -> torch.Tensor:
    """Round-to-nearest, asymmetric, GROUP_SIZE groups, dequantized back into the tensor's dtype."""
    if tensor.shape[1] % GROUP_SIZE:
        raise QuantkitError(f"group size {GROUP_SIZE} does not divide the input size {tensor.shape[1]} of {name}")
    return fake_quantize(tensor, WeightScheme(bits=bits, group_size=GROUP_SIZE, symmetric=False))


def every_decoder_linear(bits: int) -> TensorEdit:
    def edit(name: str, tensor: torch.Tensor, spec: BuildSpec):
        return group_fake_quantize(name, tensor, bits) if is_decoder_linear(name, tensor) else None
    return edit


def one_layer_weight(module: str, change: Callable[[str, torch.Tensor], torch.Tensor]) -> TensorEdit:
    """Change ``model.layers.<spec.layer>.<module>.weight`` only."""
    def edit(name: str, tensor: torch.Tensor, spec: BuildSpec):
        return change(name, tensor) if name == f"model.layers.{spec.layer}.{module}.weight" else None
    return edit


def scaled(factor: float) -> Callable[[str, torch.Tensor], torch.Tensor]:
    return lambda name, tensor: (tensor.float() * factor).to(tensor.dtype)


def write_dense_copy(base_dir: Path, out: Path,
                     edit: Callable[[str, torch.Tensor], torch.Tensor | None]) -> list[str]:
    """Copy a model directory into ``out``: every safetensors file rewritten with its tensors passed through
    ``edit`` (dtype and file metadata kept), every other file (config, tokenizer, index) copied as is.
    Returns the names of the tensors ``edit`` changed."""
    changed = []
    for source in sorted(base_dir.iterdir()):
        if source.name.startswith("."):  # lock files and staging leftovers
            continue
        target = out / source.name
        if source.suffix == ".safetensors":
            changed += _rewrite_tensors(source, target, edit)
        elif source.is_dir():
            shutil.copytree(source, target)
        else:
            shutil.copy2(source, target)
    return changed


def _rewrite_tensors(source: Path, target: Path, edit) -> list[str]:
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(source), framework="pt") as handle:
        metadata = handle.metadata()
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    changed = []
    for name, tensor in tensors.items():
        new = edit(name, tensor)
        if new is not None:
            tensors[name] = new.to(tensor.dtype).contiguous()
            changed.append(name)
    save_file(tensors, str(target), metadata=metadata)
    return changed


def dense(edit: TensorEdit) -> Build:
    def build(spec: BuildSpec, out: Path) -> dict:
        changed = write_dense_copy(spec.base_dir, out, lambda name, tensor: edit(name, tensor, spec))
        if not changed:
            raise QuantkitError(f"{spec.base_dir} has none of the tensors this candidate changes",
                                hint="a Llama-family model with model.layers.N.{self_attn,mlp}.*_proj weights")
        return {"changed": changed}
    return build


def quantized(recipe: str) -> Build:
    """The shipped recipe through quantkit's quantize pipeline, as `quantkit quantize` runs it."""
    def build(spec: BuildSpec, out: Path) -> dict:
        from quantkit.quantize.run import QuantizeOptions, quantize

        calibration = ({"calib": spec.calib} if spec.calib else
                       {"dataset": CALIB_DATASET, "num_samples": CALIB_SAMPLES, "max_seq_len": CALIB_SEQ_LEN})
        result = quantize(QuantizeOptions(model=str(spec.base_dir), recipe=recipe, out=out, overwrite=True,
                                          **calibration))
        return {"recipe": recipe, "weights": result.weights}
    return build


CANDIDATES = (
    Candidate("fp16", "the baseline against itself: every delta exactly 0", None),
    Candidate("fp8-w8a8-dynamic", "shipped recipe: FP8 weights, per-token FP8 activations",
              quantized("fp8-w8a8-dynamic")),
    Candidate("gptq-w4a16-g64-actorder", "shipped recipe: GPTQ INT4 g64, act order",
              quantized("gptq-w4a16-g64-actorder"), uses=("calib",)),
    Candidate("rtn-w4a16-g64", "shipped recipe: RTN INT4 g64", quantized("rtn-w4a16-g64")),
    Candidate("rtn-w3-g64", "every decoder linear RTN 3-bit g64 asym (dense copy)", dense(every_decoder_linear(3))),
    Candidate("rtn-w2-g64", "every decoder linear RTN 2-bit g64 asym (dense copy)", dense(every_decoder_linear(2))),
    Candidate("break-down-proj-2bit", "one layer's mlp.down_proj RTN 2-bit g64 asym, all else untouched",
              dense(one_layer_weight("mlp.down_proj", lambda name, t: group_fake_quantize(name, t, 2))),
              uses=("layer",)),
    Candidate("break-v-proj-scale", "one layer's self_attn.v_proj x 1.25 (a scale 25% off), all else untouched",
              dense(one_layer_weight("self_attn.v_proj", scaled(1.25))), uses=("layer",)),
)


@dataclass
class BuiltCandidate:
    name: str
    path: Path
    build_seconds: float
    reused: bool


def build_candidate(candidate: Candidate, spec: BuildSpec, root: Path, rebuild: bool = False) -> BuiltCandidate:
    """The candidate's directory under ``root``: reused when its record matches, else built atomically."""
    if candidate.build is None:
        return BuiltCandidate(candidate.name, spec.base_dir, 0.0, reused=False)
    target, key = root / candidate.name, candidate.key(spec)
    record = _read_record(target)
    if record and record.get("key") == key and not rebuild:
        return BuiltCandidate(candidate.name, target, record["build_seconds"], reused=True)
    started = time.perf_counter()
    with atomic_output_dir(target, overwrite=True) as staging:
        details = candidate.build(spec, staging)
        seconds = round(time.perf_counter() - started, 2)
        record = {"candidate": candidate.name, "claim": candidate.claim, "key": key, "build_seconds": seconds,
                  **details}
        (staging / BUILD_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    return BuiltCandidate(candidate.name, target, seconds, reused=False)


def _read_record(target: Path) -> dict | None:
    try:
        return json.loads((target / BUILD_RECORD).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def select_candidates(only: str | None) -> list[Candidate]:
    """The ladder, or the comma-separated names in ``only``, in ladder order."""
    if not only:
        return list(CANDIDATES)
    names = [n.strip() for n in only.split(",") if n.strip()]
    known = [c.name for c in CANDIDATES]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise QuantkitError(f"--only {only!r}: unknown candidate {', '.join(unknown) or '(none given)'}",
                            hint=f"known: {', '.join(known)}")
    return [c for c in CANDIDATES if c.name in names]


def pick_layer(base_dir: Path, layer: int | None) -> int:
    from quantkit.models import load_config

    count = load_config(base_dir).num_hidden_layers
    if layer is None:
        return count // 2
    if not 0 <= layer < count:
        raise QuantkitError(f"--layer {layer} is out of range: {base_dir} has layers 0..{count - 1}")
    return layer


# ---- summarizing (pure: reads only EvalResult / GateResult / Measurement public attributes) ----------------

@dataclass
class LadderRow:
    candidate: str
    path: str
    build_seconds: float
    reused: bool
    eval_seconds: float | None
    passed: bool
    perplexity_increase_pct: float | None  # pooled over the token datasets
    kl_mean: float | None
    top1_agreement: float | None
    worst_task: str | None  # the task with the largest accuracy drop
    worst_task_drop: float | None  # points
    worst_task_drop_high: float | None  # the upper end of its confidence interval
    gates_compared: int
    gates_skipped: int
    failed: dict[str, list[str]] = field(default_factory=dict)  # kind (token / task / layer) -> failed gates


def summarize(built: BuiltCandidate, result) -> LadderRow:
    """One table row from an EvalResult."""
    drops = [m for m in result.measurements if m.metric in TASK_METRICS]
    worst = max(drops, key=lambda m: m.estimate.value, default=None)
    gates = list(result.gates)
    return LadderRow(
        candidate=built.name, path=str(built.path), build_seconds=built.build_seconds, reused=built.reused,
        eval_seconds=(result.header or {}).get("wall_seconds"), passed=bool(result.passed),
        perplexity_increase_pct=_pooled(result, "perplexity_increase_pct"), kl_mean=_pooled(result, "kl_mean"),
        top1_agreement=_pooled(result, "top1_agreement"),
        worst_task=worst.scope if worst else None, worst_task_drop=worst.estimate.value if worst else None,
        worst_task_drop_high=worst.estimate.high if worst else None,
        gates_compared=sum(not g.skipped for g in gates), gates_skipped=sum(bool(g.skipped) for g in gates),
        failed=failed_gates(gates))


def _pooled(result, metric: str) -> float | None:
    return next((m.estimate.value for m in result.measurements if m.metric == metric and m.scope == POOLED), None)


def gate_kind(metric: str) -> str:
    if metric in TOKEN_METRICS:
        return "token"
    return "task" if metric in TASK_METRICS else "layer"


def failed_gates(gates) -> dict[str, list[str]]:
    """Failed gates by kind: token gates by metric (with the dataset when not pooled), task gates by task."""
    failed: dict[str, list[str]] = {}
    for g in gates:
        if g.passed or g.skipped:
            continue
        failed.setdefault(gate_kind(g.metric), []).append(_gate_label(g))
    return failed


def _gate_label(gate) -> str:
    if gate_kind(gate.metric) == "task":
        return gate.scope
    return gate.metric if gate.scope in (POOLED, "layers", "-") else f"{gate.metric}[{gate.scope}]"


def deviations_from_identity(result) -> list[str]:
    """Measurements where the candidate differs from the baseline: none for a model against itself."""
    return [f"{m.metric}[{m.scope}]" for m in result.measurements if m.candidate != m.baseline]


def table_cells(row: LadderRow) -> list[str]:
    """One row of the table, in COLUMNS order."""
    failed = sum(len(labels) for labels in row.failed.values())
    skipped = f" ({row.gates_skipped} skipped)" if row.gates_skipped else ""
    return [row.candidate, _number(row.perplexity_increase_pct, "+.2f"), _number(row.kl_mean, ".4f"),
            _number(row.top1_agreement, ".3f"), _task_cell(row), f"{failed}/{row.gates_compared}{skipped}",
            "; ".join(_failed_cell(kind, labels) for kind, labels in row.failed.items()) or "-",
            "PASS" if row.passed else "FAIL",
            f"{row.build_seconds:.1f}" + (" (reused)" if row.reused else ""), _number(row.eval_seconds, ".0f")]


def _failed_cell(kind: str, labels: list[str]) -> str:
    """Up to MAX_LISTED gates by name; more as a count (gate-ladder.json lists them all)."""
    return f"{kind}: {', '.join(labels)}" if len(labels) <= MAX_LISTED else f"{kind}: {len(labels)} gates"


def _task_cell(row: LadderRow) -> str:
    if row.worst_task is None:
        return "-"
    high = f" ({row.worst_task_drop_high:+.1f})" if row.worst_task_drop_high is not None else ""
    return f"{row.worst_task_drop:+.1f}{high} {row.worst_task}"


def _number(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def markdown(rows: list[LadderRow], title: str) -> str:
    lines = [f"## {title}", "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in table_cells(row)) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def rich_table(rows: list[LadderRow], title: str):
    from rich.table import Table

    table = Table(title=title)
    for column in COLUMNS:
        table.add_column(column, no_wrap=column not in ("candidate", "failed gates"))
    for row in rows:
        cells = table_cells(row)
        verdict = COLUMNS.index("result")
        cells[verdict] = f"[green]{cells[verdict]}[/]" if row.passed else f"[red]{cells[verdict]}[/]"
        table.add_row(*cells)
    return table


# ---- running --------------------------------------------------------------------------------------------

@dataclass
class GateLadderOptions:
    model: str = "smollm2-135m"
    suite: str = "default"
    gates: str = "default"
    limit: int | None = None
    calib: Path | None = None
    only: str | None = None  # comma-separated candidate names
    layer: int | None = None  # None: the middle decoder layer
    rebuild: bool = False
    out: Path = Path("bench-gate")
    threads: int = 1


@dataclass
class GateLadderResult:
    model: str
    base_dir: str
    suite: str
    gates: str
    limit: int | None
    layer: int
    rows: list[LadderRow]
    warnings: list[str]
    seconds: float

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def title(self) -> str:
        return (f"{self.model}: eval gate on candidates with known regressions (suite {self.suite}, gates "
                f"{self.gates}, limit {self.limit or 'none'}, breaks in layer {self.layer})")


def run_gate_ladder(opts: GateLadderOptions, progress: Callable[[str], None] | None = None) -> GateLadderResult:
    """Build each candidate (or reuse it) and evaluate it against the baseline, in ladder order: the fp16
    row comes first and costs no build, so a bad suite or gate file fails within seconds."""
    from quantkit.models import resolve_model

    started = time.perf_counter()
    say = progress or (lambda message: None)
    torch.set_num_threads(opts.threads)
    candidates = select_candidates(opts.only)
    if opts.calib and not (opts.calib / "manifest.json").is_file():
        raise QuantkitError(f"--calib {opts.calib} is not a quantkit calibrate output (no manifest.json)")
    base_dir = resolve_model(opts.model)
    spec = BuildSpec(base_dir, pick_layer(base_dir, opts.layer), opts.calib)
    rows, warnings = [], []
    for candidate in candidates:
        say(f"{candidate.name}: building")
        built = build_candidate(candidate, spec, opts.out / "candidates", opts.rebuild)
        say(f"{candidate.name}: evaluating")
        result = evaluate(built, opts)
        rows.append(summarize(built, result))
        if candidate.build is None:
            warnings += _baseline_warnings(result)
    return GateLadderResult(opts.model, str(base_dir), opts.suite, opts.gates, opts.limit, spec.layer, rows,
                            warnings, round(time.perf_counter() - started, 1))


def evaluate(built: BuiltCandidate, opts: GateLadderOptions):
    from quantkit.eval.run import EvalOptions, run_eval

    return run_eval(EvalOptions(baseline=opts.model, candidate=str(built.path),
                                report=opts.out / "reports" / built.name, suite=opts.suite, gates=opts.gates,
                                limit=opts.limit, overwrite=True))


def _baseline_warnings(result) -> list[str]:
    """The baseline against itself must pass every gate with every delta exactly 0."""
    warnings = []
    deviations = deviations_from_identity(result)
    if deviations:
        warnings.append(f"fp16 against itself differs on {', '.join(deviations)}")
    if not result.passed:
        warnings.append("fp16 against itself fails a gate")
    return warnings


def write_outputs(result: GateLadderResult, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "gate-ladder.md").write_text(markdown(result.rows, result.title))
    (out / "gate-ladder.json").write_text(json.dumps(result.as_dict(), indent=2, default=str) + "\n")
