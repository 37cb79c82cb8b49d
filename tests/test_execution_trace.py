"""Execution traces (ExecutionTraceObserver JSON) that torch wrote with op names unescaped: read
leniently where the damage is one string, the repair said in the manifest; other files stay
one-line errors."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import corpus
from perfswarm.errors import TraceFormatError
from perfswarm.trace.ingest import ImportOptions, import_traces
from perfswarm.trace.readers import execution_trace
from perfswarm.trace.readers.fields import Placement
from perfswarm.trace.store import Run

# record_function names as a user may give them; torch 2.13 writes each into the JSON as it is
NAMES = ["\x1b[31mANSI\x1b[0m", 'line1\nline2\t"quote"', "back\\slash", "{{7*7}} ${x} %s"]
ESCAPED = ("execution trace read leniently: op names torch wrote unescaped (a quote, a "
           "backslash or a control character), escaped")
RAW = "execution trace read leniently: control characters in its strings read as text"


def observer_text(names: list[str], schema: str = "1.1.1-chakra.0.0.4",
                  op_schema: str = "") -> bytes:
    """An execution trace as torch's observer writes one (its layout, from a torch 2.13 file):
    each name, and the op schema, written as they are, unescaped."""
    def node(i: int, name: str) -> str:
        if schema.startswith("1.0"):
            return (f'    {{\n      "name": "{name}", "id": {i}, "rf_id": {i}, "parent": 1, '
                    f'"fw_parent": 0, "seq_id": -1, "scope": 0, "tid": 1, "fw_tid": 0, '
                    f'"op_schema": "{op_schema}",\n      "inputs": [], "input_shapes": [], '
                    f'"input_types": [],\n      "outputs": [], "output_shapes": [], '
                    f'"output_types": []\n    }}')
        return (f'      {{\n        "id": {i}, "name": "{name}", "ctrl_deps": 1,\n'
                f'        "inputs": {{"values": [], "shapes": [], "types": [], "strides": []}},\n'
                f'        "outputs": {{"values": [], "shapes": [], "types": [], "strides": []}},\n'
                f'        "attrs": [{{"name": "rf_id", "type": "uint64", "value": {i}}},'
                f'{{"name": "op_schema", "type": "string", "value": "{op_schema}"}}]\n      }}')
    nodes = ",\n".join(node(i + 2, n) for i, n in enumerate(["aten::add", *names]))
    return (f'{{\n  "schema": "{schema}", "pid": 7, "time": "2026-12-05 23:59:07", '
            f'"start_ts": 1,\n  "nodes": [\n{nodes}\n  ],\n  "finish_ts": 2\n}}').encode()


@pytest.mark.parametrize("schema", ["1.1.1-chakra.0.0.4", "1.0.1"])
def test_names_torch_wrote_unescaped_are_read(tmp_path: Path, schema: str) -> None:
    path = tmp_path / "et.json"
    path.write_bytes(observer_text(NAMES, schema))
    with pytest.raises(orjson.JSONDecodeError):  # no JSON parser takes it
        orjson.loads(path.read_bytes())
    found = execution_trace.read(path, Placement(rank=0))
    assert found.graph_nodes.column("name").to_pylist() == ["aten::add", *NAMES]
    assert found.warnings == {ESCAPED: 3}  # the fourth needed no escaping


def test_a_trace_written_right_is_read_as_it_is(tmp_path: Path) -> None:
    """Names already escaped (a JSON writer's) are not escaped twice, and nothing is said."""
    path = tmp_path / "et.json"
    path.write_bytes(observer_text([orjson.dumps(n).decode()[1:-1] for n in NAMES]))
    found = execution_trace.read(path, Placement(rank=0))
    assert found.graph_nodes.column("name").to_pylist() == ["aten::add", *NAMES]
    assert found.warnings == {}


def test_control_characters_in_other_strings_are_read_as_text(tmp_path: Path) -> None:
    path = tmp_path / "et.json"
    path.write_bytes(observer_text(["a\tb"], op_schema="f(Tensor\tx)"))
    found = execution_trace.read(path, Placement(rank=0))
    assert found.graph_nodes.column("name").to_pylist() == ["aten::add", "a\tb"]
    assert found.graph_nodes.column("attrs").to_pylist()[1] == orjson.dumps(
        [{"name": "rf_id", "type": "uint64", "value": 3},
         {"name": "op_schema", "type": "string", "value": "f(Tensor\tx)"}]).decode()
    assert found.warnings == {ESCAPED: 1, RAW: 1}


@pytest.mark.parametrize(("text", "why"), [
    (b"\x00\x01binary", "invalid JSON: JSON is malformed: invalid character (byte 0)"),
    # broken elsewhere too (cut short): not mended; the error is the file's first, as it is
    (observer_text(NAMES)[:-40], "invalid JSON: JSON is malformed: invalid character "
     "(byte 483)"),
    (b'{"traceEvents": []}', "not an execution trace: Object missing required field `nodes`"),
])
def test_what_is_no_execution_trace_stays_an_error(tmp_path: Path, text: bytes,
                                                    why: str) -> None:
    path = tmp_path / "et.json"
    path.write_bytes(text)
    with pytest.raises(TraceFormatError) as caught:
        execution_trace.read(path, Placement(rank=0))
    assert str(caught.value) == f"{path} (json): {why}"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1), st.integers(0, 3), st.binary(max_size=3)),
                min_size=1, max_size=4))
def test_a_damaged_trace_is_read_or_refused(edits: list[tuple[float, int, bytes]]) -> None:
    """Bytes cut, replaced or inserted anywhere (quotes, controls, braces): the lenient read
    gives the graph or a TraceFormatError, never another exception."""
    import tempfile

    data = observer_text(NAMES)
    for at, cut, insert in edits:
        i = int(at * len(data))
        data = data[:i] + insert + data[i + cut:]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "et.json"
        path.write_bytes(data)
        try:
            found = execution_trace.read(path, Placement(rank=0))
        except TraceFormatError as exc:
            assert "\n" not in str(exc)
        else:
            assert set(found.warnings) <= {ESCAPED, RAW}


def test_an_import_says_what_it_mended(tmp_path: Path) -> None:
    """The import had refused the whole Run (the recorder kept the Run and dropped the op
    graph); now the graph is there and the manifest says what was escaped, in which file."""
    et = tmp_path / "et-rank0.json"
    et.write_bytes(observer_text(NAMES))
    run = import_traces([corpus("simple_add")], tmp_path / "r.run",
                        ImportOptions(execution_traces=(et,)), ["t"])
    assert run.table("graph_nodes").column("name").to_pylist() == ["aten::add", *NAMES]
    assert {"source": "et-rank0.json", "what": ESCAPED, "count": 3} in run.manifest()["warnings"]


def test_a_recording_keeps_its_op_graph(tmp_path: Path) -> None:
    """A recording whose execution trace holds such names: its op graph had been dropped
    ('execution trace unreadable, no op graph'); now it is kept, and the warning says what was
    mended."""
    from perfswarm.recorder.build import Recording, build_run
    from perfswarm.trace.store import new_manifest

    raw = tmp_path / "rec"
    raw.mkdir()
    (raw / "et-rank0-pid7.json").write_bytes(observer_text(NAMES))
    manifest = new_manifest(["x"])
    manifest["collectors"] = {"torch": {"status": "ok", "files": []}}
    run = build_run(Recording(raw, manifest, None, 0), tmp_path / "t.run", force=False)
    assert run.table("graph_nodes").column("name").to_pylist() == ["aten::add", *NAMES]
    assert [w for w in run.manifest()["warnings"] if "execution trace" in w["what"]] == [
        {"source": "et-rank0-pid7.json", "what": ESCAPED, "count": 3},
        {"source": "et-rank0-pid7.json", "count": 1,
         "what": "execution trace without a Kineto trace to join"}]


def test_torch_s_own_execution_trace_joins_its_kineto_trace(tmp_path: Path) -> None:
    """torch (2.2 on) writes schema 1.1: the parent as `ctrl_deps`, the record function id and
    thread in `attrs`. Read as 1.0, none of a torch 2.13 trace's 2,221 nodes had a parent or an
    rf_id, so none joined its event (nor did the tensor hand-overs between threads). Every op
    node now has the parent and rf_id the raw JSON gives it, and joins the Kineto event of its
    Record function id, of the same name."""
    import subprocess
    import sys

    from perfswarm.trace.ingest import ImportOptions, import_traces

    script = f"""
import torch
from torch.profiler import ExecutionTraceObserver, profile
et = ExecutionTraceObserver().register_callback({str(tmp_path / "et.json")!r})
net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
opt = torch.optim.SGD(net.parameters(), lr=0.1)
with profile(execution_trace_observer=et) as prof:
    for _ in range(2):
        opt.zero_grad()
        net(torch.randn(8, 16)).sum().backward()
        opt.step()
prof.export_chrome_trace({str(tmp_path / "trace.json")!r})
"""
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True)
    raw = orjson.loads((tmp_path / "et.json").read_bytes())
    assert raw["schema"].startswith("1.1")
    attrs = {n["id"]: {a["name"]: a["value"] for a in n["attrs"]} for n in raw["nodes"]}
    kineto = orjson.loads((tmp_path / "trace.json").read_bytes())["traceEvents"]
    named = {e["args"]["Record function id"]: e["name"] for e in kineto
             if e.get("cat") == "cpu_op" and "Record function id" in e.get("args", {})}
    run = import_traces([tmp_path / "trace.json"], tmp_path / "r.run", ImportOptions(
        execution_traces=(tmp_path / "et.json",)), ["t"])
    nodes = run.table("graph_nodes").to_pydict()
    by_id = dict(zip(nodes["node_id"], zip(nodes["parent"], nodes["rf_id"], nodes["name"],
                                           strict=True), strict=True))
    assert {i: (p, f) for i, (p, f, _) in by_id.items()} == {
        n["id"]: (n["ctrl_deps"], attrs[n["id"]]["rf_id"]) for n in raw["nodes"]}
    ops = [(f, name) for _, f, name in by_id.values() if f in named]
    assert len(ops) > 50 and all(named[f] == name for f, name in ops)
    events = run.table("events", columns=["rf_id"]).column("rf_id").to_pylist()
    assert {f for f, _ in ops} <= set(events)


def test_a_recording_keeps_the_observer_off_the_program_s_stderr(tmp_path: Path) -> None:
    """The encoder fast path under a padding mask (tests/data/encoder_padmask.py) runs its ops
    on nested tensors, whose sizes torch's ExecutionTraceObserver cannot read: it logged each
    such op with the exception's C++ stack trace, 984 lines on the program's stderr in the
    profiled step alone. The program's stderr is now what it is bare (torch's own
    UserWarning included; the Kineto profiler's start and stop lines held back too), and the
    manifest names the ops the trace lacks: the Kineto ops between its first and last node
    that no node has, from the raw files."""
    import subprocess
    import sys
    from collections import Counter

    script = Path(__file__).parent / "data" / "encoder_padmask.py"
    bare = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          check=True).stderr
    out = tmp_path / "r.run"
    recorded = subprocess.run([sys.executable, "-m", "perfswarm.cli.main", "record", "--quiet",
                               "--steps", "2:3", "-c", "torch", "--out", str(out), "--",
                               sys.executable, str(script)],
                              capture_output=True, text=True, check=True).stderr
    assert "UserWarning: The PyTorch API of nested tensors" in bare
    assert recorded == bare
    (et_path,) = (out / "raw").glob("et-*.json")
    (kineto_path,) = (out / "raw").glob("torch-*.json")
    nodes = {a["value"] for n in orjson.loads(et_path.read_bytes())["nodes"]
             for a in n["attrs"] if a["name"] == "rf_id"}
    ops = {e["args"]["Record function id"]: e["name"]
           for e in orjson.loads(kineto_path.read_bytes())["traceEvents"]
           if e.get("cat") == "cpu_op" and "Record function id" in e.get("args", {})}
    joined = sorted(nodes & ops.keys())
    lacking = Counter(name for i, name in ops.items()
                      if joined[0] <= i <= joined[-1] and i not in nodes)
    assert lacking["aten::_nested_tensor_from_mask"] == 1 and len(joined) > 100
    (warning,) = [w for w in Run(out).manifest()["warnings"] if "no node" in w["what"]]
    assert warning["count"] == lacking.total() and warning["source"] == et_path.name
    most = sorted(lacking.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
    assert warning["what"] == ("ops inside the execution trace's span with no node (its "
                               "observer failed on them): " + ", ".join(
                                   f"{name} x{n}" for name, n in most) + ", ...")
