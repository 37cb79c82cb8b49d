"""Reading a folder of GPU kernel measurements laid out like shared/gpu-kernels (NeuSight's
data): `device_configs/<GPU>.json`, `train/<op>/<GPU>.csv.gz`, optionally `test/<set>.csv.gz`
and `labels/<GPU>/<case>.csv.gz` (whole models, of which the inference cases' nodes that launch
one GEMM, layer norm, softmax or elementwise kernel are read, where they add up to the e2e that
`<case>.json` gives: SUMS_TO). Latencies in milliseconds, FP32."""

from __future__ import annotations

import csv
import io
import math
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final, Literal

import orjson

from perfswarm.errors import ParameterError, PerfswarmError
from perfswarm.model.gpu.aten import op_kernels
from perfswarm.model.gpu.hardware import Hardware
from perfswarm.model.gpu.labels import LAYER, node_ops
from perfswarm.model.gpu.work import Family, Work, conv_work, gemm_work, vector_work
from perfswarm.model.specs import spec_for_device
from perfswarm.trace import gunzip

Split = Literal["train", "test", "label"]
ELEMENTWISE_OPS: Final = ("add", "addu", "mul", "mulu", "div", "divu", "pow", "powu", "relu",
                          "gelu", "tanh")
COLUMNS: Final[Mapping[str, tuple[str, ...]]] = {
    "linear": ("B", "M", "N", "K"), "bmm": ("B", "M", "N", "K"),
    "conv": ("B", "Input_Channel", "Output_Channel", "Kernel_Szie", "Input_Size", "Stride",
             "Padding"),
    **dict.fromkeys((*ELEMENTWISE_OPS, "ln", "softmax"), ("B", "H")),
}
# a label node's ops that launch another kernel than the sweeps' of their family: a gather, a
# strided copy
NOT_SWEPT: Final = frozenset({"aten::embedding", "aten::copy_"})
# a case's nodes train nothing where, each timed alone, they add up (head + num_layer x layer)
# to more than its measured e2e over SUMS_TO: then they timed more than the kernels the model
# ran (the A100's BERT-large batches 8 and 16 and GPT-2 large batches 4 and 8: 1.18-1.54x
# their e2e; every other inference case of the five GPUs is within 0.89-1.09x of its e2e:
# docs/benchmarks.md, twenty-third pass)
SUMS_TO: Final = 0.85


@dataclass(frozen=True)
class Measurement:
    work: Work
    gpu: str       # the device config's name
    seconds: float
    split: Split  # label: a node of a whole model
    case: str = ""  # a label's case (its file's name: bert_large-inf-512-8)
    # the part of a label's latency that is no kernel's: its GPU's fastest kernel node's
    # latency over its labels (a sweep's is the model's to find, per GPU)
    floor_s: float | None = None


@dataclass(frozen=True)
class Dataset:
    path: str
    hardware: Mapping[str, Hardware]  # by the configs' device names
    rows: tuple[Measurement, ...]

    def gpus(self) -> list[str]:
        """The GPUs with measurements, in name order."""
        return sorted({r.gpu for r in self.rows})


def work_of(op: str, values: Mapping[str, int]) -> Work:
    """A measured op's work from its row's shape columns."""
    v = values
    # NeuSight's GEMMs multiply M x N by N x K: the output is M x K, N the reduction (the
    # launch grids say so: ceil(K / tile) x ceil(M / tile) blocks), while a Work's n is its
    # output's columns and k its reduction, as predict reads an aten op
    if op == "linear":
        return gemm_work("linear", 1, v["M"], v["K"], v["N"], bias=True)
    if op == "bmm":
        return gemm_work("bmm", v["B"], v["M"], v["K"], v["N"])
    if op == "conv":
        return conv_work(v["B"], v["Input_Channel"], v["Output_Channel"], v["Kernel_Szie"],
                         v["Input_Size"], v["Stride"], v["Padding"])
    family: Family = "norm" if op == "ln" else "softmax" if op == "softmax" else "elementwise"
    return vector_work(family, op, v["B"], v["H"])


def _hardware(folder: Path) -> dict[str, Hardware]:
    """Each config's device, by its name and its file's: the specs of devices.yaml where that
    knows the device (the specs predict reads, so a model is fitted and used on the same
    figures; NeuSight's configs give the P4 40 SMs of 64 cores, its die has 20 of 128), so
    that such a config needs only its Device (and Dev_Mem, to tell variants apart:
    benchmarks/gpu_sweep.py writes what the driver says, no bandwidth or FLOP/s); the
    config's own figures otherwise (Hardware.of_config)."""
    configs = folder / "device_configs"
    files = sorted(configs.glob("*.json")) if configs.is_dir() else []
    if not files:
        raise PerfswarmError(f"{configs}: no device configs (*.json) in the dataset")
    out = {}
    for path in files:
        try:
            config = orjson.loads(path.read_bytes())
            name = str(config["Device"])
            spec = spec_for_device(name, float(config["Dev_Mem"]) * 1e9
                                   if "Dev_Mem" in config else None)
            hw = (replace(Hardware.of_spec(spec), name=name) if spec is not None
                  else Hardware.of_config(config))
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError,
                AttributeError) as exc:
            raise PerfswarmError(f"{path}: not a device config ({type(exc).__name__}: "
                                 f"{exc})") from None
        out[hw.name] = hw
        out[path.stem.replace("_", " ")] = hw
    return out


def _rows(path: Path) -> Iterator[dict[str, str]]:
    """The rows of a gzipped CSV, inflated a chunk at a time (a gzip bomb is refused as a
    trace's is)."""
    try:
        if not gunzip.is_gzip(path):
            raise EOFError("not gzip")
        with io.TextIOWrapper(gunzip.open_text(path), encoding="utf-8", newline="") as f:
            yield from csv.DictReader(f)
    except (OSError, EOFError, UnicodeDecodeError, zlib.error) as exc:
        raise PerfswarmError(f"{path}: not a readable gzip CSV ({exc})") from None


def _read(path: Path, op_of_row: str | None, hardware: Mapping[str, Hardware], split: Split,
          gpu: str | None) -> Iterator[Measurement]:
    for line, row in enumerate(_rows(path), start=2):
        op = op_of_row or row.get("OPName", "")
        if op not in COLUMNS:
            continue  # a test set's other families
        try:
            values = {c: int(float(row[c])) for c in COLUMNS[op]}
            seconds = float(row["Latency"]) * 1e-3
            name = gpu or row["Device"]
        except (KeyError, TypeError, ValueError, OverflowError) as exc:  # inf: OverflowError
            raise PerfswarmError(f"{path}: line {line}: missing or malformed column "
                                 f"({exc})") from None
        if name not in hardware:
            raise PerfswarmError(f"{path}: line {line}: no device config for {name!r}")
        if not 0 < seconds < math.inf or min(values.values()) < 0:  # nan too
            raise PerfswarmError(f"{path}: line {line}: latency and shapes must be positive "
                                 "and finite")
        yield Measurement(work_of(op, values), hardware[name].name, seconds, split)


def _labels(path: Path) -> list[tuple[Work, float]]:
    """The kernels of a whole model's inference case that its nodes measured alone: the
    nodes that launch one kernel of a swept family, with their forward latency (s); none
    where the nodes add up past the case's e2e (SUMS_TO; a case without its .json is kept)."""
    found = list(_label_nodes(path))
    kernels = [(w, s) for w, s, _ in found if w is not None]
    meta = path.with_name(path.name.removesuffix(".csv.gz") + ".json")
    if not meta.exists():
        return kernels
    try:
        case = orjson.loads(meta.read_bytes())
        e2e, layers = float(case["e2e_latency"]) * 1e-3, int(case["num_layer"])
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise PerfswarmError(f"{meta}: not a label case's summary ({type(exc).__name__}: "
                             f"{exc})") from None
    nodes = sum(s * (layers if in_layer else 1) for _, s, in_layer in found)
    return kernels if e2e >= SUMS_TO * nodes else []


def _label_nodes(path: Path) -> Iterator[tuple[Work | None, float, bool]]:
    """Each node of a label file: the one kernel of a swept family it launches (None: other
    kernels or none), its forward latency (s), whether it is in the repeated layer."""
    for line, row in enumerate(_rows(path), start=2):
        try:
            ops = node_ops(row, train_case=False)
            seconds = float(row["fw_latency"] or 0) * 1e-3
            fp32 = row["dtype"] == "torch.float32"
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise PerfswarmError(f"{path}: line {line}: missing or malformed column "
                                 f"({exc})") from None
        if not 0 <= seconds < math.inf:
            raise PerfswarmError(f"{path}: line {line}: fw_latency must be positive and finite")
        forward = ops[0] if ops and fp32 and seconds > 0 else []
        works = [w for name, shapes in forward for w in op_kernels(name, shapes) or []]
        swept = (len(works) == 1 and works[0].family != "conv"
                 and forward[0][0] not in NOT_SWEPT)
        yield works[0] if swept else None, seconds, bool(LAYER.search(row.get("meta", "")))


def load_dataset(folder: Path) -> Dataset:
    """Every measurement of the folder; a missing folder, config or malformed file raises a
    one-line PerfswarmError naming it."""
    if not folder.is_dir():
        raise ParameterError("dataset", "no such directory", value=folder)
    hardware = _hardware(folder)
    train = folder / "train"
    files = sorted(train.glob("*/*.csv.gz")) if train.is_dir() else []
    if not files:
        raise PerfswarmError(f"{train}: no measurements (train/<op>/<GPU>.csv.gz)")
    rows: list[Measurement] = []
    for path in files:
        op = path.parent.name
        if op in COLUMNS:
            gpu = path.name.removesuffix(".csv.gz").replace("_", " ")
            if gpu not in hardware:
                raise PerfswarmError(f"{path}: no device config for {gpu!r} in "
                                     f"{folder / 'device_configs'}")
            rows += _read(path, op, hardware, "train", gpu)
    if not rows:
        raise PerfswarmError(f"{train}: no measurements in its files")
    tests = folder / "test"
    # a row two test sets hold is one measurement (shared/gpu-kernels' vec.csv.gz is elem's,
    # ln's and softmax's rows again: kept, it had scored each layer norm and softmax twice)
    rows += dict.fromkeys(m for path in (sorted(tests.glob("*.csv.gz")) if tests.is_dir()
                                         else []) for m in _read(path, None, hardware, "test",
                                                                 None))
    labels = folder / "labels"
    for gpu_dir in sorted(labels.iterdir()) if labels.is_dir() else []:
        gpu = gpu_dir.name.replace("_", " ")
        cases = {p.name.removesuffix(".csv.gz"): _labels(p)
                 for p in sorted(gpu_dir.glob("*-inf-*.csv.gz"))}
        if cases and gpu not in hardware:
            raise PerfswarmError(f"{gpu_dir}: no device config for {gpu!r} in "
                                 f"{folder / 'device_configs'}")
        # the GPU's floor: its fastest kernel node (as a sweep's is its 1st-percentile latency)
        floor = min((s for found in cases.values() for _, s in found), default=0.0)
        rows += (Measurement(w, hardware[gpu].name, s, "label", case, floor)
                 for case, found in cases.items() for w, s in found)
    return Dataset(str(folder), hardware, tuple(rows))
