"""perfswarm: record, ingest, analyze, model, optimize and report ML workload performance."""

__version__ = "0.1.0"
