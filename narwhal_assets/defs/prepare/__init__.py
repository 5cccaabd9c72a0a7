"""The `prepare` group: source bundle, role environments and the deployment manifest."""
