"""Where student code runs when grading isolated: an unprivileged user, an allow-listed
environment, a private home, and a tree it can read but not write.

The trusted test process starts the worker (:mod:`reference.grader.worker`) through
:func:`worker_command`. As root it switches to :data:`WORKER_USER` (created with ``useradd``
when missing, as on Gradescope and CI runners); with passwordless ``sudo`` it goes through
``sudo -n -u``. Otherwise isolated grading is refused, saying why (:class:`IsolationError`):
a worker running as the grader's own user could still signal, trace or overwrite the grader.

NOTE: the user switch is the boundary. Every worker process runs under ``no_new_privs``
(:func:`_no_new_privs`). As root, where the kernel allows it, each worker also runs in a PID
namespace of its own (:func:`pid_namespace_works`): whatever it leaves running dies with it.
A fuller namespace sandbox (bubblewrap) would add more where the platform has one; neither is
required.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from reference.grader.bytecode import python_argv

#: The account student code runs as.
WORKER_USER = os.environ.get("PAGEDLAB_WORKER_USER", "pagedlab-worker")
#: The only variables of the grader's environment a worker sees (besides its own HOME/TMPDIR).
ENV_ALLOW = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "LAB_IMPL", "PAGEDLAB_IMPL_DIR",
             "PAGEDLAB_TEST_DEVICE", "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "CUDA_PATH",
             "NVIDIA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
#: Variables a test may change while it runs (``monkeypatch.setenv``) that student code reads:
#: each request carries their values when they changed since the last one, and the worker sets
#: them before the call, as one process would see them.
FORWARDED_ENV = ("PAGEDLAB_DEBUG",)
#: The emulated device's state as the test's process sees it (``emulation()`` around a test,
#: ``emulated_capability``), forwarded with every call like :data:`FORWARDED_ENV`: the worker
#: runs the student's launchers on the device the test built its inputs for.
DEVICE_ENV = ("PAGEDLAB_DEVICE", "PAGEDLAB_EMU_CAPABILITY")
#: Set in the test process's environment (to ``root`` or ``sudo``: how to switch users) when
#: its ``impl`` must be a worker proxy.
ISOLATED_ENV = "PAGEDLAB_ISOLATED"

#: Labs whose tests the isolated worker cannot serve yet, with the reason: graded in-process even
#: when grading is isolated (the report names them), so a correct submission never loses points
#: to the isolation. Each entry is a hole in the threat model, listed in the README.
IN_PROCESS_LABS: dict[str, str] = {}


#: Labs graded in-process when a CUDA GPU is visible (their CPU tests are graded isolated).
#: Empty: CUDA tensors cross by CUDA IPC (reference.grader.shared: views keep their layout, a
#: stray store lands in the test's memory) and a test's PAGEDLAB_DEBUG reaches the worker
#: (FORWARDED_ENV).
GPU_IN_PROCESS_LABS: dict[str, str] = {}


def in_process_reason(lab: str) -> str | None:
    """Why ``lab`` is graded in-process even when grading is isolated; None when it is not.

    Args:
        lab: a lab folder name.
    """
    if lab in IN_PROCESS_LABS:
        return IN_PROCESS_LABS[lab]
    if lab in GPU_IN_PROCESS_LABS and _cuda_visible():
        return GPU_IN_PROCESS_LABS[lab]
    return None


def _nvidia_device_present() -> bool:
    """True when this machine has an NVIDIA device node (a GPU CUDA could use).

    NOTE: not ``torch.cuda.is_available()``: importing torch costs a test process that never
    needs it (Lab 3's) seconds, and every isolated test process asks.
    """
    return os.path.exists("/dev/nvidiactl") or any(
        name.startswith("nvidia") and name[6:].isdigit() for name in os.listdir("/dev"))


def _cuda_visible() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


class IsolationError(RuntimeError):
    """Isolated grading is impossible here (no way to run code as another user)."""


def _user_exists() -> bool:
    try:
        pwd.getpwnam(WORKER_USER)
        return True
    except KeyError:
        return False


def _is_root() -> bool:
    return os.geteuid() == 0


def _has_sudo() -> bool:
    if shutil.which("sudo") is None:
        return False
    return subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0


def ensure_worker_user() -> str:
    """Makes sure :data:`WORKER_USER` exists and can run this interpreter.

    Returns:
        How the worker will be started: ``"root"`` (``Popen(user=...)``) or ``"sudo"``.

    Raises:
        IsolationError: not root and no passwordless sudo, the user cannot be created, or
            the user cannot run this Python (an interpreter under a private home, e.g.).
    """
    if _is_root():
        how, prefix = "root", []
    elif _has_sudo():
        how, prefix = "sudo", ["sudo", "-n"]
    else:
        raise IsolationError(
            "isolated grading runs student code as another user, which needs root or "
            "passwordless sudo; this grader has neither (run it as root, or in a container)")
    try:
        pwd.getpwnam(WORKER_USER)
    except KeyError:
        made = subprocess.run([*prefix, "useradd", "--system", "--no-create-home", "--shell",
                               "/usr/sbin/nologin", WORKER_USER], capture_output=True, text=True)
        if made.returncode != 0 and not _user_exists():  # NOTE: another grader made it meanwhile
            raise IsolationError(f"could not create the user {WORKER_USER!r}: "
                                 f"{made.stderr.strip()}") from None
    from reference.paths import REPO_ROOT

    if how == "root":
        grant_traverse([Path(os.path.realpath(sys.executable)), Path(sys.executable), REPO_ROOT])
    try:
        probe = subprocess.run([*_switch(how), *_no_new_privs(), "env", "-i", sys.executable,
                                "-s", "-c", "import numpy, reference.grader.worker"],
                               capture_output=True, text=True, cwd=REPO_ROOT, **_popen_user(how))
    except OSError as exc:  # e.g. the user may not enter REPO_ROOT
        raise IsolationError(f"the user {WORKER_USER!r} cannot work in {REPO_ROOT} ({exc}): "
                             f"the workbook must be readable by every user") from None
    if probe.returncode < 0:  # NOTE: killed (a signal), not refused: say so
        raise IsolationError(f"the probe run as {WORKER_USER!r} was killed by signal "
                             f"{-probe.returncode} (another process of that user?)")
    if probe.returncode != 0:
        raise IsolationError(
            f"the user {WORKER_USER!r} cannot run {sys.executable} on {REPO_ROOT} "
            f"({probe.stderr.strip()[-300:]}): Python and the workbook must be readable by "
            f"every user (not under a private home)")
    return how


def grant_traverse(paths: list[Path]) -> list[Path]:
    """Lets every user *enter* (``o+x``, not list) each folder above ``paths`` (root only).

    The worker's user must reach the interpreter and the workbook; a CI runner or a container
    often keeps them under ``/root`` (mode 0700). Entering a folder reveals nothing by itself:
    its listing stays private, and only files that are readable by everyone (as the
    interpreter's are) can be opened by a name known in advance.

    Args:
        paths: files or folders the worker must reach.

    Returns:
        The folders whose mode was changed.
    """
    changed = []
    for path in paths:
        for folder in Path(path).parents:
            mode = folder.stat().st_mode
            if not mode & 0o001:
                folder.chmod(mode | 0o001)
                changed.append(folder)
    return changed


def kill_worker_processes(how: str) -> None:
    """Kills every process of :data:`WORKER_USER` (a worker's children that outlived it too).

    Speed grading calls it before timing: a process the student's code left running could
    share the GPU while the ceiling is measured.

    Args:
        how: from :func:`ensure_worker_user` (``"root"`` kills directly, ``"sudo"`` through sudo).
    """
    uid = pwd.getpwnam(WORKER_USER).pw_uid
    _kill_until_gone(lambda: [int(d) for d in os.listdir("/proc")
                              if d.isdigit() and _owner(d) == uid], how, "processes")


def _kill_until_gone(find, how: str, what: str) -> None:
    """SIGKILLs the pids ``find()`` returns until it returns none (50 rounds at most).

    Raises:
        IsolationError: some still live after 50 rounds.
    """
    for _ in range(50):
        pids = find()
        if not pids:
            return
        if how == "root":
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        else:
            subprocess.run(["sudo", "-n", "kill", "-KILL", *map(str, pids)], capture_output=True)
        time.sleep(0.1)
    raise IsolationError(f"{what} of {WORKER_USER!r} survive SIGKILL")


def _parent(pid: int) -> int | None:
    """The parent pid of a live process (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rpartition(")")[2].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def orphaned_worker_processes() -> list[int]:
    """Returns the processes of :data:`WORKER_USER` that no grading runs any more.

    A grading's worker (and a child it starts) descends from that grading's test process,
    another user's. A process whose first ancestor outside the worker user is init (pid 1) or
    gone outlived the grading that started it: a daemon that double-forked, a child left
    behind when the worker was killed. NOTE: another grading running at the same time keeps
    its workers (their test process is alive); only the orphans go. Where an ancestor other
    than init adopts orphans (a subreaper), they are not recognised.
    """
    try:
        uid = pwd.getpwnam(WORKER_USER).pw_uid
    except KeyError:
        return []
    owners = {int(d): _owner(d) for d in os.listdir("/proc") if d.isdigit()}
    orphans = []
    for pid, owner in owners.items():
        if owner != uid:
            continue
        up, seen = _parent(pid), {pid}
        # NOTE: through the worker's own processes and the unshare that started it: a worker
        # that outlives its test process (one that cleared its parent-death signal) hangs
        # below an unshare whose parent is then init.
        while up is not None and up not in seen and (
                owners.get(up, _owner(str(up))) == uid or _is_launcher(up)):
            seen.add(up)
            up = _parent(up)
        if up is None or up <= 1:
            orphans.append(pid)
    return orphans


def make_homes_folder() -> Path:
    """Returns a fresh folder for one test process's worker homes (:data:`HOMES_ENV`): others
    may enter it (the worker must reach its home) but not list it."""
    path = Path(tempfile.mkdtemp(prefix="pagedlab-homes-"))
    path.chmod(0o711)
    return path


def remove_homes_folder(path: Path, how: str) -> None:
    """Removes a :func:`make_homes_folder` folder and the worker homes in it.

    Args:
        path: the folder.
        how: from :func:`ensure_worker_user` (``"sudo"``: the homes' files are another user's).
    """
    shutil.rmtree(path, ignore_errors=True)
    if path.exists() and how == "sudo":
        subprocess.run(["sudo", "-n", "rm", "-rf", "--", str(path)], capture_output=True)


def kill_orphaned_worker_processes(how: str) -> None:
    """Kills :func:`orphaned_worker_processes` (again while new orphans appear).

    The grader calls it after each test process: a process the student's code left running
    must not outlive its grading (it could kill or spy on the next submission's worker).

    Args:
        how: from :func:`ensure_worker_user` (``"root"`` kills directly, ``"sudo"`` through sudo).
    """
    _kill_until_gone(orphaned_worker_processes, how, "orphaned processes")


def kill_process_group(pgid: int, how: str | None) -> None:
    """Kills process group ``pgid`` (a child started with ``start_new_session``), quietly if
    it is gone.

    Args:
        pgid: the group's id (its leader's pid).
        how: ``"sudo"`` when the group is the worker's and only sudo can signal it; ``"root"``
            or None (this process's own user) signal it directly.
    """
    if how == "sudo":
        subprocess.run([*_switch(how), "kill", "-KILL", "--", f"-{pgid}"], capture_output=True)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _owner(pid: str) -> int | None:
    """The real uid of a live process (None once it is gone, or a zombie: it runs nothing).

    NOTE: a process whose first thread exited while others run shows "Z" in its own stat:
    it is alive while any of its threads is not a zombie (a red team's daemon hid so).
    NOTE: the real uid, not the owner of ``/proc/<pid>``: that is root for a process that
    made itself non-dumpable or ran a setuid program (a red team's worker ran ``passwd``).
    """
    try:
        with open(f"/proc/{pid}/stat") as fh:
            if fh.read().rpartition(")")[2].split()[0] == "Z" and not _any_live_thread(pid):
                return None
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
        return None
    except (OSError, IndexError, ValueError):
        return None


def _is_launcher(pid: int) -> bool:
    """True for an ``unshare`` run by root: what starts a worker in its PID namespace
    (:func:`_switch`). The worker user cannot start one (it gains no privileges on exec)."""
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip() == "unshare" and _owner(str(pid)) == 0
    except OSError:
        return False


def _any_live_thread(pid: str) -> bool:
    """True when a thread of process ``pid`` is not a zombie."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as fh:
                if fh.read().rpartition(")")[2].split()[0] != "Z":
                    return True
        except (OSError, IndexError):
            continue
    return False


def _switch(how: str) -> list[str]:
    """The command prefix that runs what follows as :data:`WORKER_USER`."""
    if how == "sudo":
        return ["sudo", "-n", "-u", WORKER_USER, "--"]
    if worker_in_namespace(how):
        entry = pwd.getpwnam(WORKER_USER)
        # NOTE: unshare runs as root, makes the namespace, forks its first process and only
        # there switches to the worker (no supplementary groups left); --kill-child: killing
        # unshare (a timeout, the proxy's kill) kills that process, and with it the namespace.
        # --mount-proc: the worker's /proc shows its namespace only, so it cannot open another
        # grading's worker (same user) through /proc/<pid>/mem, nor read anyone's command line.
        # --ipc: SysV shared memory and message queues die with the namespace too.
        return [shutil.which("unshare") or "unshare", *_UNSHARE_FLAGS,
                f"--setuid={entry.pw_uid}", f"--setgid={entry.pw_gid}", "--"]
    return []


def _no_new_privs() -> list[str]:
    """The prefix that keeps the worker from gaining privileges on exec: a setuid program runs
    with the worker's own (a red team's worker ran ``passwd`` as root to hide from the orphan
    sweep and to clear the parent-death signal that ends its namespace)."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--no-new-privs", "--"] if setpriv else []


def _popen_user(how: str) -> dict:
    if how != "root" or worker_in_namespace(how):  # NOTE: unshare switches the user itself
        return {}
    entry = pwd.getpwnam(WORKER_USER)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


#: How a worker's namespaces are made (:func:`_switch`), and what :func:`pid_namespace_works` tries.
_UNSHARE_FLAGS = ("--pid", "--fork", "--kill-child", "--mount-proc", "--ipc")
_pid_namespace: bool | None = None  # pid_namespace_works()'s answer, asked once per process


def pid_namespace_works() -> bool:
    """True when this (root) process can start workers in PID namespaces of their own.

    A worker is then process 1 of its namespace: when it exits or is killed, the kernel kills
    every process left in the namespace at once, however fast they fork (a red team's fork
    chain outran the orphan scans, :func:`kill_orphaned_worker_processes`), and nothing in it
    can signal a process outside it, another grading's worker included; its ``/proc`` shows
    only its own namespace (``/proc/<pid>/mem`` of another worker is out of reach). Needs root
    and ``unshare`` (util-linux); a container without ``CAP_SYS_ADMIN`` refuses it, and then
    workers run without a namespace (the orphan sweep alone).

    NOTE: never on a machine with an NVIDIA GPU. CUDA tensors cross to the worker by CUDA IPC,
    and ``cudaIpcOpenMemHandle`` in a process of another PID namespace fails with
    ``cudaErrorOperatingSystem`` (H200, driver 580, 2026-11-30); Labs 4-5 graded isolated
    then hung until their time limit.
    """
    global _pid_namespace
    if _pid_namespace is None:
        _pid_namespace = False
        if _is_root() and shutil.which("unshare") and not _nvidia_device_present():
            try:
                _pid_namespace = subprocess.run(
                    [shutil.which("unshare"), *_UNSHARE_FLAGS, "--", "true"],
                    capture_output=True, timeout=30).returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                pass
    return _pid_namespace


def namespace_worker_pid(unshare_pid: int) -> int | None:
    """The pid (as this process's ``/proc`` names it) of the worker that ``unshare`` started:
    its only child; None while it has none."""
    try:
        with open(f"/proc/{unshare_pid}/task/{unshare_pid}/children") as fh:
            children = fh.read().split()
    except OSError:
        children = [d for d in os.listdir("/proc")
                    if d.isdigit() and _parent(int(d)) == unshare_pid]
    return int(children[0]) if len(children) == 1 else None


def worker_in_namespace(how: str) -> bool:
    """True when workers started with ``how`` run in PID namespaces of their own."""
    return how == "root" and pid_namespace_works()


#: Set by the grader for a test process: the folder its workers' homes go in, removed with
#: everything in it once the test process and the worker user's orphans are gone (a home
#: holds the student's compiled kernels: the next submission's worker must not find them).
HOMES_ENV = "PAGEDLAB_WORKER_HOMES"


def make_worker_home() -> Path:
    """Returns a fresh private folder owned by the worker user (its HOME and TMPDIR), inside
    the grader's folder for this test process (:data:`HOMES_ENV`) when there is one."""
    parent = os.environ.get(HOMES_ENV) or None
    home = Path(tempfile.mkdtemp(prefix="pagedlab-worker-", dir=parent))
    if _is_root():
        entry = pwd.getpwnam(WORKER_USER)
        os.chown(home, entry.pw_uid, entry.pw_gid)
    else:
        home.chmod(0o777)  # sudo: the worker's uid is not ours; the folder is still private
    return home


def worker_argv(argv: list[str], how: str, home: Path,
                **extra_env: str) -> tuple[list[str], dict]:
    """Returns (argv, extra Popen keyword arguments) that run ``argv`` as the worker user, with
    the worker's environment (:data:`ENV_ALLOW`, its own HOME and TMPDIR) and ``extra_env``.

    Args:
        argv: the command.
        how: from :func:`ensure_worker_user`.
        home: from :func:`make_worker_home`.
        **extra_env: more variables (e.g. ``PYTHONPATH`` for the workbook).
    """
    env = {k: os.environ[k] for k in ENV_ALLOW if k in os.environ}
    env.update(HOME=str(home), TMPDIR=str(home), PYTHONDONTWRITEBYTECODE="1",
               PYTHONPYCACHEPREFIX=str(home / "pycache"), PYTHONNOUSERSITE="1", **extra_env)
    # NOTE: `env -i` builds the environment from nothing, also through sudo (which resets
    # it on its own terms).
    return [*_switch(how), *_no_new_privs(), "env", "-i",
            *(f"{k}={v}" for k, v in env.items()), *argv], \
        _popen_user(how)


def worker_command(module_args: list[str], how: str, home: Path) -> tuple[list[str], dict]:
    """Returns (argv, extra Popen keyword arguments) that start a worker.

    Args:
        module_args: arguments after ``python -m reference.grader.worker``.
        how: from :func:`ensure_worker_user`.
        home: from :func:`make_worker_home`.
    """
    # NOTE: the interpreter runs with -s (no user site) and -E is not used since the worker's
    # variables are the whole environment anyway.
    return worker_argv(python_argv("reference.grader.worker", *module_args), how, home)
