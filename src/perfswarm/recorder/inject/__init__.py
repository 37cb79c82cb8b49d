"""Code injected into the user's Python process (sitecustomize)."""
