"""What the tests of scripts/ that read text on stdin share: running one of them on given input, the checks
every reader of per-launch lines takes (--all and input without its lines), and the closing report (each
failure, then "<test>: N failures", the line CTest's PASS_REGULAR_EXPRESSION reads)."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_script(name, text, *args):
    """scripts/<name> with `text` on stdin and args: (exit status, stdout)."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", name), *args], input=text,
                       capture_output=True, text=True, check=False)
    return r.returncode, r.stdout


def launch_reader_checks(name, text, empty_text, empty_message):
    """scripts/<name> with --all on `text` (launches first_kernel and second_kernel) must show both, and on
    `empty_text` must fail with `empty_message` in its output: the failures, as strings."""
    failures = []
    rc, out = run_script(name, text, "--all")
    if rc != 0 or "first_kernel" not in out or "second_kernel" not in out:
        failures.append("--all does not show every launch")
    rc, out = run_script(name, empty_text)
    if rc == 0 or empty_message not in out:
        failures.append(f"input without its lines is not reported ({empty_message!r})")
    return failures


def report(test, failures):
    """Prints the failures and the summary line; the exit status for them."""
    for f in failures:
        print("FAIL " + f)
    print(f"{test}: {len(failures)} failures")
    return 1 if failures else 0
