"""What the tests of scripts/ that read text on stdin share: running one of them on given input, and the
closing report (each failure, then "<test>: N failures", the line CTest's PASS_REGULAR_EXPRESSION reads)."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_script(name, text, *args):
    """scripts/<name> with `text` on stdin and args: (exit status, stdout)."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", name), *args], input=text,
                       capture_output=True, text=True, check=False)
    return r.returncode, r.stdout


def report(test, failures):
    """Prints the failures and the summary line; the exit status for them."""
    for f in failures:
        print("FAIL " + f)
    print(f"{test}: {len(failures)} failures")
    return 1 if failures else 0
