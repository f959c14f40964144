"""Click commands, one module per verb; imported lazily by specpress.cli."""
