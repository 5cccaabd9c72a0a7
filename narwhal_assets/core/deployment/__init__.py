"""Deployments, a prepared run installed on hosts: which hosts run the latest one, drift, pruning."""
