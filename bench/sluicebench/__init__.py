"""sluice's benchmark lab: datasets, strategies, measurement, report. Entry point: bench/run."""
