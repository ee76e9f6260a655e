#!/usr/bin/env python3
"""Drops a committed report's per-metric SVGs where its overview.svg already holds every metric.

usage: benches/scripts/trim_plots.py REPORT_DIR...

For each REPORT_DIR/report.md (and every report.md below it) whose directory has overview.svg,
the list lines `- Label: [SVG](name.svg)` that `pace bench` and `pace sim` write are replaced by
one sentence, and the SVGs they linked are deleted unless the report still shows them (an
embedded `![...](name.svg)`). The command in the report makes them again. This keeps the
tracked tree small enough to travel to the GPU machine with the CUDA binary
(server/tests/cuda_build.rs, `tracked_files_leave_room_for_the_cuda_binary`).
"""
import pathlib
import re
import sys

LINE = re.compile(r"^- [^\n]*: \[SVG\]\(([\w.-]+\.svg)\)$")
NOTE = ("- Every metric is in `overview.svg`, one panel each; the per-metric SVGs the command also "
        "writes are left out of the repository to keep it small (the command makes them again).")


def trim(report: pathlib.Path) -> int:
    d = report.parent
    if not (d / "overview.svg").exists():
        return 0
    lines = report.read_text().split("\n")
    out, dropped, noted = [], [], False
    for line in lines:
        m = LINE.match(line)
        if m and m.group(1) != "overview.svg":
            dropped.append(m.group(1))
            if not noted:
                out.append(NOTE)
                noted = True
            continue
        out.append(line)
    if not dropped:
        return 0
    text = "\n".join(out)
    report.write_text(text)
    freed = 0
    for name in dropped:
        f = d / name
        if f.exists() and f"({name})" not in text:
            freed += f.stat().st_size
            f.unlink()
    return freed


def main() -> None:
    total = 0
    for arg in sys.argv[1:]:
        root = pathlib.Path(arg)
        reports = [root] if root.name == "report.md" else sorted(root.rglob("report.md"))
        for r in reports:
            total += trim(r)
    print(f"freed {total / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
