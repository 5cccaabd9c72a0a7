"""A prepared run (`deploy-hosts prepare`): its manifest and layout, role files, inputs, staleness, verification."""
