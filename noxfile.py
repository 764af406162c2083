"""nox sessions: tests (CPU), lint, gpu (GPU tests, on a GPU machine), bench (a suite on the GPU)."""

import nox

nox.options.sessions = ["tests", "lint"]
CPU_TORCH = "torch==2.13.0"


@nox.session(python="3.11")
def tests(session):
    """The CPU test suite (references, torch backend, harness, CLI, report, Triton in the interpreter)."""
    session.install(CPU_TORCH, "-e", ".[test]")
    session.run("pytest", *session.posargs)


@nox.session(python="3.11")
def lint(session):
    session.install("ruff")
    session.run("ruff", "check", ".")


@nox.session(python=False)
def gpu(session):
    """GPU tests on a machine with CUDA and `pip install -e '.[gpu,test]'` done (uses the current Python)."""
    session.run("python", "-m", "pytest", "-m", "gpu or flashinfer or cute or fla or sm90", "-v", *session.posargs)


@nox.session(python=False)
def bench(session):
    """The default GPU suites on this machine's GPU; pass suite names to choose others."""
    session.run("attnbench", "sweep", *session.posargs)
