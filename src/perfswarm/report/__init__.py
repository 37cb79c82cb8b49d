"""Report data as plain dicts, and its renderers."""
