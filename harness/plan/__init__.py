"""Stage plan: what a sweep will run. Suites (YAML, with file:line errors) expanded into cases, traces,
model presets, known failures (expectations) and the capability matrix (docs/architecture.md).
Imports the core and check/ (a suite's tolerance is a check's rule)."""
