"""Stage cli: the entry points. The `attnbench` command line (app.py), its console output, `attnbench
selftest` and the pytest plugin; each builds a run.session.Session (docs/architecture.md). Nothing
imports this stage but `python -m attnbench`."""
