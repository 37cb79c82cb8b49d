"""perfswarm: record, ingest, analyze, model, optimize and report ML workload performance.

The Python API (docs/api.md)::

    import perfswarm
    run = perfswarm.import_traces("trace.json.gz", out="trace.run")  # or load(), record()
    run.analyze().to_polars("kernels")

Its names are imported when first used (api.py), so `import perfswarm` and the CLI's start-up
stay light."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from perfswarm.api import Result, Run, import_traces, load, record
    from perfswarm.errors import (
        NotApplicable,
        ParameterError,
        PerfswarmError,
        RunError,
        TraceFormatError,
    )

_API = {"Run": "api", "Result": "api", "load": "api", "import_traces": "api", "record": "api",
        "PerfswarmError": "errors", "ParameterError": "errors", "NotApplicable": "errors",
        "RunError": "errors", "TraceFormatError": "errors"}
__all__ = ["NotApplicable", "ParameterError", "PerfswarmError", "Result", "Run", "RunError",
           "TraceFormatError", "__version__", "import_traces", "load", "record"]


def __dir__() -> list[str]:
    """The API's names, loaded when first used (completion in a notebook lists them), not
    the module's own imports."""
    return sorted(__all__)


def __getattr__(name: str) -> Any:
    if name not in _API:
        raise AttributeError(f"module 'perfswarm' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f"perfswarm.{_API[name]}"), name)
