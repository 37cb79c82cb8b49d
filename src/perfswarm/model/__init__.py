"""Performance models: hardware specs, op cost, kernel models, simulation."""
