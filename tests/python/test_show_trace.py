"""scripts/show_trace.py on synthetic trace lines (kernels/ptx/trace.cuh's format): the marks
relative to warpgroup 0's first, the consumers' mean phases over the tiles after the first, the
last launch by default and every one with --all, and a clear line when there is no trace."""
import re
import sys

from script_runner import launch_reader_checks, report, run_script


def run(text, *args):
    return run_script("show_trace.py", text, *args)


def launch(name, base, tile_cycles, staged=False):
    """Three tiles of two consumer warpgroups and a producer: Q wait 1000, first S 2000, loop 10000,
    last P.V 1500, NaN check 200, store 2500 cycles (staged: O staged 1000 of them, mark 7); the next
    tile starts 300 after the store."""
    lines = [f"TRACE {name}"]
    for n in range(3):
        t0 = base + n * tile_cycles
        c = [t0, t0 + 1000, t0 + 3000, t0 + 13000, t0 + 14500, t0 + 14700, t0 + 17200, t0 + 15700 if staged else 0]
        for w in (0, 1):
            lines.append(f"TRACE wg{w} n{n} " + " ".join(str(x) for x in c))
        lines.append(f"TRACE wg2 n{n} {t0 - 500} {t0 - 400} {t0 - 300} {t0 - 200} {t0 + 9000} 0 0 0")
    return lines


def phases(out):
    """The summary line's phases in show_trace.py's output as a dict of kilocycles."""
    m = re.search(r"mean over the tiles after the first: (.*)", out)
    got = dict((k, float(v)) for k, v in re.findall(r"([A-Za-z. ]+?) ([0-9.]+)k", m.group(1))) if m else {}
    return {k.strip(" ,"): v for k, v in got.items()}


def main():
    failures = []
    text = "\n".join(["probe header", "== rep 1"] + launch("first_kernel", 10_000, 17_500) + ["== rep 2"] +
                     launch("second_kernel", 50_000, 17_500)) + "\n"
    rc, out = run(text)
    if rc != 0:
        failures.append(f"exit status {rc}")
    if "second_kernel" not in out or "first_kernel" in out:
        failures.append("default output is not the last launch alone")
    want = {"Q wait": 1.0, "first S": 2.0, "key loop": 10.0, "last P.V": 1.5, "NaN check": 0.2, "O store": 2.5,
            "a whole tile": 17.5}
    got = phases(out)
    if got != want:
        failures.append(f"phases {got} != {want}")
    rc, staged = run("\n".join(launch("staged_kernel", 10_000, 17_500, staged=True)) + "\n")
    want_staged = dict(want, **{"O staged": 1.0, "O store": 1.5})
    got = phases(staged)
    if rc != 0 or got != want_staged:
        failures.append(f"with mark 7: phases {got} != {want_staged}")
    if not re.search(r"n0 wg0:\s+0\.00\s+1\.00\s+3\.00", out):
        failures.append("marks not in kilocycles from warpgroup 0's first")
    if not re.search(r"n0 wg2:\s+-0\.50", out):
        failures.append("the producer's marks missing or misplaced")
    failures += launch_reader_checks("show_trace.py", text, "no trace here\n", "no TRACE lines")
    return report("test_show_trace", failures)


if __name__ == "__main__":
    sys.exit(main())
