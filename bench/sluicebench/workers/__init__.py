"""Programs a strategy runs as its own process, so they are measured like any other tool."""
