"""One module per group of CLI commands; each command parses, calls one function, renders."""
