"""The management checkout on the workstation: private files, config-set publish, checkpoint store, git bundle."""
