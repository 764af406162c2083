"""Built-in YAML suites (package data). `models/presets.yaml` holds the model presets."""

CPU_DEFAULT = ["smoke"]
GPU_DEFAULT = ["decode", "extend", "mla", "swa", "spec", "gdn"]
