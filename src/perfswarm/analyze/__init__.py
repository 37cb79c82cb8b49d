"""Pure analyses over a Run's tables, returning frozen dataclasses."""
