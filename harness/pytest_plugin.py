"""pytest plugin (entry point `pytest11: attnbench`): run attnbench suites as parametrized tests.

    pytest --attnbench smoke --attnbench-backend torch

Each (case, backend) becomes one test that asserts the correctness verdict (a skip row is a skip).
"""

from __future__ import annotations


def pytest_addoption(parser):
    group = parser.getgroup("attnbench")
    group.addoption("--attnbench", action="append", default=[], metavar="SUITE", help="run this attnbench suite as tests")
    group.addoption("--attnbench-backend", action="append", default=[], metavar="NAME", help="only these backends")
    group.addoption("--attnbench-device", default="auto", help="auto, cpu, cuda or cuda:N")
