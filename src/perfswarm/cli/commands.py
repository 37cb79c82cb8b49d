"""Imports every command module so that each registers itself on the app."""

from perfswarm.cli import import_cmd, info_cmd, sql_cmd

__all__ = ["import_cmd", "info_cmd", "sql_cmd"]
