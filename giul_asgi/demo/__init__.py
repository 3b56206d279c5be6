"""A demo gateway and a simulated OpenAI-compatible upstream, for trying giul-asgi on a
machine with no GPU (and for its tests and benchmarks)."""
