"""Advice rules, one module per family; each rule is `Facts -> Advice | None`."""
