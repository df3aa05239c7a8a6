"""Synthetic cuobjdump -sass listings for the tests of scripts/sass_*.py, a run of such a script on
one, and the tests' count of failed expectations."""
import os
import subprocess
import sys
import tempfile


def listing(name, insns):
    """A cuobjdump -sass function block: its header, each instruction 16 bytes on from the last
    with the encoding comments, as cuobjdump writes them."""
    out = ["", f"\t\tFunction : {name}", "\t.headerflags\t@\"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)\""]
    for i, text in enumerate(insns):
        out.append(f"        /*{i * 16:04x}*/                   {text} ;   /* 0x000000000000000000 */")
        out.append("                                                    /* 0x000fe20000000f00 */")
    return out


def run_on(script, lines, *args):
    """(exit status, stdout + stderr) of `script --sass FILE args...`, FILE holding lines."""
    with tempfile.NamedTemporaryFile("w", suffix=".sass", delete=False) as f:
        f.write("\n".join(lines) + "\n")
    try:
        r = subprocess.run([sys.executable, script, "--sass", f.name, *args], capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    return r.returncode, r.stdout + r.stderr


class ScriptTest:
    """The test of scripts/NAME: runs it on listings (run) or with arguments of its own (call), counts the
    expectations that fail, and ends with the summary line CTest matches (finish)."""

    def __init__(self, name):
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        self.script, self.failures = os.path.join(root, "scripts", name), 0

    def run(self, lines, *args):
        return run_on(self.script, lines, *args)

    def call(self, *args):
        """The script run with args (none: its usage error)."""
        return subprocess.run([sys.executable, self.script, *args], capture_output=True, text=True)

    def expect(self, what, cond, out=""):
        if not cond:
            self.failures += 1
            print(f"FAIL {what}\n{out}")

    def finish(self, test):
        print(f"{test}: {self.failures} failures")
        sys.exit(1 if self.failures else 0)
