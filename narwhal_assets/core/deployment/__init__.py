"""A prepared deployment: its manifest and layout, role files, verification, what hosts run, pruning."""
