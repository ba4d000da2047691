from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

BROWSER_TIMINGS: dict[str, float] = {}
"""Seconds measured by the browser tests (tests/test_browser.py), shown after the run."""


@pytest.fixture(autouse=True)
def grad_mode_is_left_on():
    """Grad mode is per thread and global: a test that leaves it off makes later tests'
    own autograd fail far from the cause, so the test that leaks it fails instead."""
    yield
    leaked = not torch.is_grad_enabled()
    torch.set_grad_enabled(True)
    assert not leaked, "this test left torch's grad mode off for the thread"


def pytest_terminal_summary(terminalreporter):
    if BROWSER_TIMINGS:
        from tests.test_browser import CONTENTION  # noqa: PLC0415 (only when it ran)

        terminalreporter.section("dashboard timings in headless Chromium")
        if CONTENTION > 1:
            terminalreporter.write_line(f"(machine busy at the start: budgets x{CONTENTION:.1f})")
        for name, seconds in BROWSER_TIMINGS.items():
            terminalreporter.write_line(f"{name}: {seconds:.2f} s")
