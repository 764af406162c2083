"""Stage store: what a run leaves behind. Result rows and results.jsonl, the run directory, run.json and
env.json, the column registry, row counts, the reference cache (docs/architecture.md).
Imports the core and check/ (columns come from the checks' declarations); never plan/."""
