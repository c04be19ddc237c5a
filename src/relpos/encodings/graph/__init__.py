"""Graph and tree encodings: biases from a per-call structure (adjacency, parents)."""
