"""Stage check: what a correct row is. The tolerance rule, the prepared call a check may drive, the
output checks against float64 and the ordered list of `Check`s the runner applies (docs/architecture.md).
Imports only the core (errors, dtypes, buffers, case, backend, ops/)."""
