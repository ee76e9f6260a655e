"""pytest hooks for deploy/test: a loud banner when the real-server end-to-end test was skipped."""


def pytest_terminal_summary(terminalreporter):
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if "real_pace_serve" in r.nodeid]
    if skipped:
        tr = terminalreporter
        tr.write_sep("!", "REAL-SERVER E2E SKIPPED", red=True, bold=True)
        tr.write_line("test_e2e.py::test_e2e_real_pace_serve did not run: `pace serve` is not available yet.")
        tr.write_line("The dashboard and rules were checked end to end against fake_pace.py (the metric contract),")
        tr.write_line("not against the server. Set PACE_CMD or build pace with `serve` to run it.")
        tr.write_sep("!", "", red=True, bold=True)
