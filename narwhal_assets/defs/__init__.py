"""Dagster definitions by asset group (discovery, deployment, installation), over workflows and core."""
