"""Recording: the session runner and one module per collector."""
