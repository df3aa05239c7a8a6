"""scripts/show_timeline.py on synthetic timeline lines (kernels/ptx/trace.cuh's TIMELINE format): the last
launch by default and every one with --all, the phases' medians and shares of the blocks' time, the SMs'
idle time between blocks, before the first and after the last, and a clear line when there is no
timeline; with marks 4-7 too, the start's own phases."""
import re
import sys

from script_runner import launch_reader_checks, report, run_script


def run(text, *args):
    return run_script("show_timeline.py", text, *args)


def launch(name, base, start_marks=False):
    """Two SMs, two blocks each, every block 10 us: 2 us to its first tile, 7 us of loop, 1 us of stores.
    SM 0's blocks start at 0 and 11 us (a 1 us gap), SM 1's at 1 and 10 us (1 us idle before its first, its
    blocks overlapping: no gap); the span is 0-21 us, so SM 1 is idle 1 us after its last block and SM 0 none.
    start_marks: marks 4-7 as well, at 0.1, 0.5, 1.1 and 1.8 us into each block (its start's phases 0.1, 0.4,
    0.6, 0.7 and 0.2 us)."""
    lines = [f"TIMELINE {name} 4"]
    for i, (sm, start) in enumerate([(0, 0), (1, 1000), (0, 11000), (1, 10000)]):
        t = base + start
        more = f" {t + 100} {t + 500} {t + 1100} {t + 1800}" if start_marks else ""
        lines.append(f"TIMELINE {i} {sm} {t} {t + 2000} {t + 9000} {t + 10000}{more}")
    return lines


def main():
    failures = []
    text = "\n".join(["probe header", "== rep 1"] + launch("first_kernel", 5_000) + ["== rep 2"] +
                     launch("second_kernel", 900_000) + ["TIMELINE not a block line"]) + "\n"
    rc, out = run(text)
    if rc != 0:
        failures.append(f"exit status {rc}")
    if "second_kernel" not in out or "first_kernel" in out:
        failures.append("default output is not the last launch alone")
    if not re.search(r"4 blocks on 2 SMs, span 21\.0 us, a block 10\.00 us", out):
        failures.append("blocks, SMs, span or block time wrong:\n" + out)
    for name, med, share in (("start to first tile", "2.00", "20.0"), ("key loop", "7.00", "70.0"),
                             ("stores", "1.00", "10.0")):
        if not re.search(rf"{name}\s+{re.escape(med)} us \(median\)\s+{re.escape(share)} %", out):
            failures.append(f"phase {name} not {med} us and {share} %")
    # SM-time 2 SMs x 21 us = 42: gaps 1 (SM 0), before the first 1 (SM 1), after the last 1 (SM 1)
    if "between blocks 2.4 %, before the first 2.4 %, after the last 2.4 %" not in out:
        failures.append("idle shares wrong:\n" + out)
    if "barrier inits" in out:
        failures.append("the start's phases shown without marks 4-7")
    rc, out = run("\n".join(launch("marked_kernel", 7_000, start_marks=True)) + "\n")
    if rc != 0 or not re.search(r"4 blocks on 2 SMs, span 21\.0 us", out):
        failures.append("a launch with marks 4-7 is not read:\n" + out)
    for name, med in (("barrier inits", "0.10"), ("indices, K/V issued", "0.40"), ("query-tile search", "0.60"),
                      ("until K/V landed", "0.70"), ("until the first tile", "0.20")):
        if not re.search(rf"{re.escape(name)}\s+{re.escape(med)} us \(median\)", out):
            failures.append(f"start phase {name} not {med} us:\n" + out)
    failures += launch_reader_checks("show_timeline.py", text, "no timeline here\n", "no TIMELINE lines")
    rc, out = run("TIMELINE k 1\nTIMELINE 0 3 100 200 0 0\n")
    if rc == 0 or "no block reached its last mark" not in out:
        failures.append("a launch whose blocks lack marks is not reported")
    return report("test_show_timeline", failures)


if __name__ == "__main__":
    sys.exit(main())
