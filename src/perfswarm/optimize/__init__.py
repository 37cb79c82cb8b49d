"""Advice rules, what-if projection, sharding and tuning."""
