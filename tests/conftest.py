"""Fixtures shared by several test files; the helpers behind them are in tests/support/."""
import os

import pytest
import torch

from tests.support.browser import (BROWSER_TIMINGS, CHROMIUM, CHROMIUM_ARGS, CONTENTION,
                                   check_and_close, open_tab, slower_machine, streamlit_server)


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):  # one of the workers sharing the cores
        torch.set_num_threads(1)  # (`make test`): two torch threads each oversubscribe them


def pytest_collection_modifyitems(items):
    """A browser test measures the dashboard's time: it runs alone, as `serial` tests do."""
    for item in items:
        if item.get_closest_marker("browser"):
            item.add_marker(pytest.mark.serial)


@pytest.fixture(autouse=True)
def grad_mode_is_left_on():
    """Grad mode is per thread and global: a test that leaves it off makes later tests'
    own autograd fail far from the cause, so the test that leaks it fails instead."""
    yield
    leaked = not torch.is_grad_enabled()
    torch.set_grad_enabled(True)
    assert not leaked, "this test left torch's grad mode off for the thread"


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a test module that asks for it (`pytest.mark.usefixtures`): small
    convolutions on a shared 2-core machine run ~80x slower on 2 threads than 1."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ------------------------------------------------------------------ the dashboard, in AppTest

@pytest.fixture
def drawn(monkeypatch) -> list[str]:
    """Every progress text drawn while the app runs (the lines are gone when a run ends)."""
    import streamlit as st
    from streamlit.delta_generator import DeltaGenerator

    texts: list[str] = []
    real = DeltaGenerator.progress

    def recording(self, value, text=None, **kwargs):
        texts.append(text or "")
        return real(self, value, text=text, **kwargs)

    monkeypatch.setattr(DeltaGenerator, "progress", recording)
    monkeypatch.setattr(st, "progress", lambda *args, **kwargs: recording(st._main, *args,
                                                                          **kwargs))
    return texts


# ------------------------------------------------------------------ the dashboard, in Chromium

@pytest.fixture(scope="module")
def browser():
    """Headless Chromium, one per test module."""
    from playwright.sync_api import sync_playwright

    slower_machine()  # timed once, before any browser or server runs beside it
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def server(browser):  # the browser starts first: the cold start measured is the app's
    """The dashboard on a free port as `make run` starts it (scripts/serve.py), one per test
    module."""
    with streamlit_server("streamlit.log") as started:
        yield started


@pytest.fixture
def app(browser, server):
    """A fresh tab on the module's server; the test fails if the page showed an exception or
    logged an error."""
    tab, context = open_tab(browser, server)
    yield tab
    check_and_close(tab, context)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A browser test that fails shows where its module's server was at that moment: a
    server that stopped answering is found stuck, not guessed at."""
    report = (yield).get_result()
    server = getattr(item, "funcargs", {}).get("server")
    if report.failed and call.when == "call" and server is not None:
        report.sections.append(("dashboard server's threads at the failure", server.stacks()))


def pytest_terminal_summary(terminalreporter):
    if BROWSER_TIMINGS:
        terminalreporter.section("dashboard timings in headless Chromium")
        if CONTENTION > 1:
            terminalreporter.write_line(f"(machine busy at the start: budgets x{CONTENTION:.1f})")
        if slower_machine() > 1:
            terminalreporter.write_line(f"(machine slower than the budgets': budgets "
                                        f"x{slower_machine():.1f})")
        for name, seconds in BROWSER_TIMINGS.items():
            terminalreporter.write_line(f"{name}: {seconds:.2f} s")
