"""Stage run: how cases run. The runner (one case: reference, prepare, checks, timing), the executor and
its worker processes, the timing loop and GPU clocks, the session and sweep services that every entry
point builds (docs/architecture.md). Imports the core, check/, plan/ and store/; never report/ or cli/."""
