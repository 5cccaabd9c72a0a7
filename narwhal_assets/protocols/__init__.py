"""The workstation half of each host program: build its input, parse and bound its report."""
