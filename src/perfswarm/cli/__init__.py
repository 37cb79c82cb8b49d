"""Command-line interface: one module per command, no logic of its own."""
