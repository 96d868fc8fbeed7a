"""Run untrusted Python in a bubblewrap sandbox with hard resource limits.

Every run is one process tree:

    [setpriv --reuid=U --regid=U --clear-groups --] \
      prlimit --as --cpu --nproc --fsize --nofile --core -- \
      bwrap ... -- /bin/sh -c '"$0" "$@"; exit $?' python3 main.py

started in a new session (its own process group) and, when we are root, as a dedicated
unprivileged uid U. bubblewrap gives it fresh namespaces (no network, its own pid space,
no host files except read-only system binds, private size-capped tmpfs for /work, /tmp
and /dev/shm, a read-only root, all capabilities dropped, no nested user namespaces);
the rlimits cap address space, CPU seconds, process count and file size; a wall-clock
deadline and an output cap kill the run. The shell is pid 1 of the namespace: when the
program exits, the shell exits with its status and the kernel kills every process left
in the namespace, so nothing outlives a run.

Why a dedicated uid per concurrent run: Linux does not enforce RLIMIT_NPROC for uid 0,
so a fork bomb started by root is unbounded even inside a user namespace. Each slot of
the pool (`max_parallel`) owns one uid, locked with `flock` so that several processes
on one host never share a uid (their process counts would otherwise be pooled).

Why `setpriv` rather than subprocess's `user=`: a child that must change its uid before
exec is started with fork(), which copies the parent's page tables; from a trainer
holding gigabytes of JAX buffers that is ~26 ms of the parent's CPU and ~50 ms of wall
a run (measured; the code recipe makes hundreds of runs a step). Without `user=`
subprocess starts the child with vfork() (~0.2 ms), and setpriv (util-linux, like
prlimit) drops to the uid in the child. The uid change is the same: real, effective and
(at the next exec) saved ids, no supplementary groups, no capabilities left.

Without bubblewrap the constructor fails and says how to install it. The unsandboxed
fallback (rlimits, session and uid only: the code can read the host file system and
reach the network) exists solely behind `allow_unsandboxed=True` and logs a warning.

The trainer reaches only `Sandbox.run`: the python env calls it from the rollout pool's
worker threads, which already run many episodes' tool calls at once. `arun` (from an
event loop) and `run_many` (a batch of programs) are library API for other callers,
e.g. an asyncio agent framework or checking a set of programs offline.

This module is the security boundary: one process tree's whole life (the prlimit +
bwrap argv, uid slots, supervision, output caps, killing the group and the uid), to be
reviewed in one place.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import fcntl
import logging
import math
import os
import pathlib
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from typing import Iterable, Mapping, Sequence

log = logging.getLogger(__name__)

STATUSES = ("ok", "error", "timeout", "oom", "output_limit")

INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: `apt-get install -y bubblewrap`; Fedora: "
    "`dnf install bubblewrap`)"
)

# Inside the sandbox the program sees only these paths (plus /proc, /dev, /tmp, /work).
_SYSTEM_RO_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_SYSTEM_RO_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/etc/alternatives")
_WORKDIR = "/work"
_MAIN = "main.py"
_BWRAP_HELPER_PROCESSES = 2  # bwrap itself and its pid-namespace init count for nproc.
_KILL_GRACE_S = 2.0
# Python reports address-space exhaustion as MemoryError; C/C++ runtimes and the loader
# use these phrases.
_OOM_MARKERS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory")


class SandboxUnavailableError(RuntimeError):
    """bubblewrap (or prlimit) is missing or cannot create namespaces on this host."""


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """What one sandboxed run did.

    Attributes:
      status: "ok" (exit code 0), "error" (non-zero exit or a sandbox setup failure),
        "timeout" (wall-clock deadline or CPU-seconds limit), "oom" (the address-space
        limit was hit), "output_limit" (stdout or stderr exceeded the cap; the run was
        killed and the output truncated).
      exit_code: the program's exit code (128+N when a signal N ended it inside the
        sandbox); None when the sandbox killed it (timeout, output limit).
      stdout: captured standard output (UTF-8, undecodable bytes replaced), truncated.
      stderr: captured standard error, truncated the same way.
      duration_s: wall-clock seconds from start to the last process gone.
    """

    status: str
    exit_code: int | None
    stdout: str
    stderr: str
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class Sandbox:
    """Runs Python code in isolation; thread-safe, many runs in parallel.

    Args:
      allow_unsandboxed: UNSAFE. When bubblewrap is missing or cannot create namespaces,
        run code with rlimits, a new session and (as root) a dedicated uid only — no file
        system or network isolation. Off by default; a warning is logged when used.
      python: interpreter run inside the sandbox. It must live under one of the bound
        paths (the system `/usr/bin/python3` by default; a virtualenv's interpreter needs
        its prefix in `ro_binds` and must be readable by the sandbox uid).
      ro_binds: extra host paths mounted read-only at the same place inside.
      timeout_s: default wall-clock limit of `run`.
      memory_mb: default address-space limit (RLIMIT_AS) of `run`, per process.
      max_processes: process/thread limit (RLIMIT_NPROC) of the program's uid.
      max_file_mb: largest file the program may write (RLIMIT_FSIZE).
      tmpfs_mb: size of each private tmpfs (/work, /tmp and /dev/shm).
      max_output_bytes: cap on captured stdout and on stderr (each); a program that
        prints more is killed and gets status "output_limit".
      max_parallel: concurrent runs; also the number of uids reserved when root.
      uid_base: first uid of the pool (root only); default: 2_000_000_000 when the host
        maps it, else the top of the largest mapped range.
      lock_dir: where the per-uid `flock` files live (shared by every process of the host).
      bwrap: bubblewrap executable name or path.
    """

    def __init__(
        self,
        *,
        allow_unsandboxed: bool = False,
        python: str = "/usr/bin/python3",
        ro_binds: Sequence[str] = (),
        timeout_s: float = 10.0,
        memory_mb: int = 512,
        max_processes: int = 32,
        max_file_mb: int = 16,
        tmpfs_mb: int = 64,
        max_output_bytes: int = 64 * 1024,
        max_parallel: int = 16,
        uid_base: int | None = None,
        lock_dir: str | os.PathLike = os.path.join(tempfile.gettempdir(), "agentjax-sandbox"),
        bwrap: str = "bwrap",
    ):
        _check_positive(
            timeout_s=timeout_s, memory_mb=memory_mb, max_processes=max_processes,
            max_file_mb=max_file_mb, tmpfs_mb=tmpfs_mb, max_output_bytes=max_output_bytes,
            max_parallel=max_parallel,
        )
        self.python = python
        self.ro_binds = tuple(ro_binds)
        self.timeout_s = float(timeout_s)
        self.memory_mb = int(memory_mb)
        self.max_processes = int(max_processes)
        self.max_file_mb = int(max_file_mb)
        self.tmpfs_mb = int(tmpfs_mb)
        self.max_output_bytes = int(max_output_bytes)
        self.max_parallel = int(max_parallel)

        self._prlimit = shutil.which("prlimit")
        if self._prlimit is None:
            raise SandboxUnavailableError("prlimit not found on PATH; install util-linux")
        self._setpriv = shutil.which("setpriv")
        if os.geteuid() == 0:
            if self._setpriv is None:
                raise SandboxUnavailableError(
                    "setpriv not found on PATH (runs as root drop to a dedicated uid with "
                    "it); install util-linux")
            base = _pick_uid_base(self.max_parallel) if uid_base is None else int(uid_base)
            _check_uids_mapped(base, self.max_parallel)
            uids = [base + i for i in range(self.max_parallel)]
        else:
            uids = [None] * self.max_parallel  # runs as ourselves; see _nproc_limit
        self._slots = _SlotPool(uids, pathlib.Path(lock_dir))

        self._bwrap = shutil.which(bwrap)
        self.sandboxed = self._bwrap is not None
        _check_python(python, self.ro_binds, visible_inside=self.sandboxed)
        problem = (self._trial_run() if self.sandboxed else
                   f"bubblewrap ({bwrap!r}) not found on PATH; {INSTALL_HINT}")
        if problem is not None:
            if not allow_unsandboxed:
                raise SandboxUnavailableError(
                    f"{problem}. Running untrusted code without it is possible only with "
                    "Sandbox(allow_unsandboxed=True), which gives NO file-system or network "
                    "isolation."
                )
            log.warning(
                "UNSANDBOXED code execution (allow_unsandboxed=True): %s. Programs run with "
                "rlimits only and can read the host file system and use the network.",
                problem,
            )
            self.sandboxed = False

    # ------------------------------------------------------------------ public API

    def run(
        self,
        code: str,
        *,
        stdin: str | bytes = "",
        timeout_s: float | None = None,
        memory_mb: int | None = None,
        files: Mapping[str, str | bytes] | None = None,
    ) -> SandboxResult:
        """Runs `code` as `/work/main.py` and returns what happened; never raises for
        anything the code does.

        Text (`code`, `stdin`, `files`) is written as UTF-8; a lone surrogate, which UTF-8
        cannot encode, is written as its raw bytes (Python's "surrogatepass"), so a
        program holding one fails with Python's own SyntaxError instead of `run` raising.

        Args:
          code: Python source of the program.
          stdin: bytes or text fed to the program's standard input.
          timeout_s: wall-clock limit in seconds (default: the sandbox's `timeout_s`);
            the CPU-seconds rlimit is set just above it.
          memory_mb: address-space limit per process in MiB (default: `memory_mb`).
          files: extra files placed in /work before the run, {relative path: content};
            subdirectories are created. The program may modify them; nothing is copied
            back to the host.

        Raises:
          ValueError: a bad argument (non-positive limit, absolute or escaping file path).
        """
        timeout_s = self.timeout_s if timeout_s is None else float(timeout_s)
        memory_mb = self.memory_mb if memory_mb is None else int(memory_mb)
        _check_positive(timeout_s=timeout_s, memory_mb=memory_mb)
        all_files = {_MAIN: code, **_check_files(files)}
        stdin_bytes = _encode(stdin)

        uid, lock_fd = self._slots.acquire()
        try:
            with tempfile.TemporaryDirectory(prefix="agentjax-sandbox-") as staging:
                return self._run_in_slot(
                    uid, all_files, stdin_bytes, timeout_s, memory_mb, pathlib.Path(staging)
                )
        finally:
            if uid is not None:
                _kill_uid(uid)  # belt and braces; the pid namespace already did it
            self._slots.release(uid, lock_fd)

    async def arun(self, code: str, **kwargs) -> SandboxResult:
        """`run` without blocking the event loop (a worker thread waits on the process)."""
        return await asyncio.to_thread(self.run, code, **kwargs)

    def run_many(
        self, codes: Iterable[str], *, max_workers: int | None = None, **kwargs
    ) -> list[SandboxResult]:
        """Runs every program concurrently (at most `max_workers`, default
        `max_parallel`); results in input order. `kwargs` go to every `run`."""
        codes = list(codes)
        workers = min(max_workers or self.max_parallel, max(len(codes), 1))
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            return list(pool.map(lambda c: self.run(c, **kwargs), codes))

    # ------------------------------------------------------------------ internals

    def _trial_run(self) -> str | None:
        """Runs an empty program exactly as `run` will; returns why it failed, or None."""
        result = self.run("", timeout_s=30)
        if result.ok:
            return None
        return (
            f"a trial run in the sandbox failed ({result.status}, exit {result.exit_code}: "
            f"{result.stderr.strip()[-500:]}). bubblewrap needs unprivileged user "
            "namespaces (sysctl kernel.unprivileged_userns_clone=1 and user.max_user_namespaces"
            " > 0; on Ubuntu 24.04 also kernel.apparmor_restrict_unprivileged_userns=0 or an "
            "AppArmor profile for bwrap; in Docker, --security-opt seccomp=unconfined), and "
            "every bound path must be readable by the sandbox uid"
        )

    def _system_binds(self) -> list[str]:
        args = []
        for path in _SYSTEM_RO_PATHS:
            if os.path.islink(path):  # merged-/usr hosts: /bin -> usr/bin
                args += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                args += ["--ro-bind", path, path]
        for path in _SYSTEM_RO_FILES:
            args += ["--ro-bind-try", path, path]
        for path in self.ro_binds:
            args += ["--ro-bind", path, path]
        return args

    def _rlimits(self, timeout_s: float, memory_mb: int, uid: int | None) -> list[str]:
        cpu_soft = math.ceil(timeout_s) + 1  # the wall clock normally fires first
        return [
            self._prlimit,
            f"--as={memory_mb * 2**20}",
            f"--cpu={cpu_soft}:{cpu_soft + 1}",
            f"--nproc={_nproc_limit(self.max_processes, uid)}",
            f"--fsize={self.max_file_mb * 2**20}",
            "--nofile=256",
            "--core=0",
            "--",
        ]

    def _bwrap_argv(self, file_fds: Mapping[str, int]) -> list[str]:
        size = str(self.tmpfs_mb * 2**20)
        argv = [
            self._bwrap,
            "--unshare-all", "--unshare-user", "--disable-userns",
            "--die-with-parent", "--new-session", "--as-pid-1", "--cap-drop", "ALL",
            "--hostname", "sandbox",
            *self._system_binds(),
            "--proc", "/proc", "--dev", "/dev",
            "--size", size, "--tmpfs", "/dev/shm",  # --dev's own tmpfs has no size cap
            "--size", size, "--tmpfs", "/tmp",
            "--size", size, "--tmpfs", _WORKDIR,
        ]
        made_dirs = set()
        for name, fd in file_fds.items():
            for parent in reversed(pathlib.PurePosixPath(name).parents[:-1]):
                if parent not in made_dirs:
                    made_dirs.add(parent)
                    argv += ["--dir", f"{_WORKDIR}/{parent}"]
            argv += ["--file", str(fd), f"{_WORKDIR}/{name}"]
        # bwrap's root and /dev are unsized tmpfs mounts: make them read-only.
        argv += ["--remount-ro", "/dev", "--remount-ro", "/"]
        argv += ["--chdir", _WORKDIR, "--clearenv"]
        for key, value in _program_env(_WORKDIR).items():
            argv += ["--setenv", key, value]
        # A shell is pid 1 (init) of the namespace and runs the program as its child: the
        # kernel ignores default-action signals sent to an init (SIGXCPU, SIGTERM, ...),
        # and when pid 1 exits the namespace dies with every process left in it.
        return argv + ["--", "/bin/sh", "-c", '"$0" "$@"; exit $?', *self._python_argv()]

    def _python_argv(self) -> list[str]:
        return [self.python, "-B", "-E", "-s", _MAIN]

    def _run_in_slot(self, uid, files, stdin_bytes, timeout_s, memory_mb, staging):
        stdin_path = staging / "stdin"
        stdin_path.write_bytes(stdin_bytes)
        opened: dict[str, int] = {}
        try:
            if self.sandboxed:
                # bwrap copies each file from an fd we pass it into the private tmpfs.
                for i, (name, content) in enumerate(files.items()):
                    path = staging / f"file{i}"
                    path.write_bytes(_encode(content))
                    opened[name] = os.open(path, os.O_RDONLY)
                argv = self._bwrap_argv(opened)
                cwd, env = None, None
            else:
                workdir = staging / "work"
                for name, content in files.items():
                    path = workdir / name
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(_encode(content))
                if uid is not None:
                    for path in [staging, *workdir.rglob("*"), workdir]:
                        os.chown(path, uid, uid)
                argv = self._python_argv()
                cwd, env = workdir, _program_env(str(workdir))
            argv = self._rlimits(timeout_s, memory_mb, uid) + argv
            if uid is not None:
                argv = [self._setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                        "--"] + argv
            with open(stdin_path, "rb") as stdin_file:
                return _supervise(
                    argv, stdin_file, tuple(opened.values()), cwd, env, uid, timeout_s,
                    self.max_output_bytes, sandboxed=self.sandboxed,
                )
        finally:
            for fd in opened.values():
                os.close(fd)


def _supervise(argv, stdin_file, pass_fds, cwd, env, uid, timeout_s, max_output_bytes, *,
               sandboxed):
    """Starts the process tree, collects its output under the caps, and classifies it.

    `sandboxed`: `argv` starts bwrap (else the program itself, whose leftover children no
    pid namespace reaps: they are killed as soon as it exits).
    """
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv, stdin=stdin_file, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            pass_fds=pass_fds, cwd=cwd, env=env, start_new_session=True,
        )
    except OSError as e:
        return SandboxResult("error", None, "", f"sandbox failed to start: {e}",
                             time.monotonic() - start)
    chunks = {proc.stdout: [], proc.stderr: []}
    sizes = {proc.stdout: 0, proc.stderr: 0}
    killed_for = None
    reaped = False
    deadline = start + timeout_s
    give_up_at = deadline + _KILL_GRACE_S
    with selectors.DefaultSelector() as sel:
        for stream in chunks:
            os.set_blocking(stream.fileno(), False)
            sel.register(stream, selectors.EVENT_READ)
        while sel.get_map():
            now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0 and killed_for is None:
                killed_for = "timeout"
                _stop(proc, uid, sandboxed)
            if now > give_up_at:
                _kill_group(proc)
                break  # an escaped process (unsandboxed only) holds our pipes open
            for key, _ in sel.select(timeout=max(min(remaining, 0.1), 0.01)):
                data = key.fileobj.read(65536)
                if not data:
                    sel.unregister(key.fileobj)
                    continue
                room = max(max_output_bytes - sizes[key.fileobj], 0)
                chunks[key.fileobj].append(data[:room])
                sizes[key.fileobj] += len(data)
                if sizes[key.fileobj] > max_output_bytes and killed_for is None:
                    killed_for = "output_limit"
                    give_up_at = time.monotonic() + _KILL_GRACE_S
                    _stop(proc, uid, sandboxed)
            if not sandboxed and not reaped and proc.poll() is not None:
                reaped = True  # it exited by itself; stop what it left behind
                give_up_at = min(give_up_at, time.monotonic() + _KILL_GRACE_S)
                _stop(proc, uid, sandboxed)
    returncode = proc.wait()
    duration = time.monotonic() - start
    stdout = b"".join(chunks[proc.stdout]).decode(errors="replace")
    stderr = b"".join(chunks[proc.stderr]).decode(errors="replace")
    proc.stdout.close()
    proc.stderr.close()
    if killed_for is not None:
        return SandboxResult(killed_for, None, stdout, stderr, duration)
    return SandboxResult(_classify(returncode, stderr), _exit_code(returncode), stdout,
                         stderr, duration)


def _classify(returncode: int, stderr: str) -> str:
    code = _exit_code(returncode)
    if code == 0:
        return "ok"
    if code == 128 + signal.SIGXCPU:  # CPU-seconds rlimit
        return "timeout"
    tail = stderr[-2000:]
    if any(marker in tail for marker in _OOM_MARKERS):
        return "oom"
    return "error"


def _exit_code(returncode: int) -> int:
    # bwrap reports a signal-killed child as 128+N; a directly killed process as -N.
    return 128 - returncode if returncode < 0 else returncode


def _stop(proc: subprocess.Popen, uid: int | None, sandboxed: bool) -> None:
    """Kills the run's processes.

    With a dedicated uid we kill everything it owns except the outer bwrap (`proc`, when
    `sandboxed`):
    killing the program, which is pid 1 of its namespace, makes the kernel kill the rest
    of the namespace, and the outer bwrap then reaps it and exits. Killing the outer bwrap
    first would orphan the program to the host's init, where it lingers as a zombie that
    still counts against the uid's process limit. Without a dedicated uid we kill the
    process group.
    """
    if uid is not None:
        _kill_uid(uid, spare=proc.pid if sandboxed else None)
    else:
        _kill_group(proc)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _kill_uid(uid: int, spare: int | None = None) -> None:
    """SIGKILLs every process owned by `uid` (a slot's dedicated uid) but `spare`."""
    for pid in _pids_of_uid(uid):
        if pid != spare:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _pids_of_uid(uid: int) -> list[int]:
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    pids.append(int(entry.name))
            except FileNotFoundError:
                pass
    return pids


def _nproc_limit(max_processes: int, uid: int | None) -> int:
    # RLIMIT_NPROC counts every process of the real uid on the host. A dedicated slot uid
    # runs nothing else; when we run as ourselves (not root) our other processes count.
    own = 0 if uid is not None else len(_pids_of_uid(os.getuid()))
    return max_processes + _BWRAP_HELPER_PROCESSES + own


def _program_env(home: str) -> dict[str, str]:
    """The program's whole environment (nothing of ours leaks in)."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": "/tmp",
            "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8"}


def _encode(text: str | bytes) -> bytes:
    return text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)


def _check_positive(**values) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{name} must be positive, got {value!r}")


def _check_python(python: str, ro_binds: Sequence[str], visible_inside: bool) -> None:
    if not os.access(python, os.X_OK):
        raise ValueError(f"python: {python!r} is not an executable file")
    if not visible_inside:
        return
    roots = (*_SYSTEM_RO_PATHS, *ro_binds)
    if not any(os.path.commonpath([python, root]) == root for root in roots
               if os.path.isabs(python)):
        raise ValueError(f"python: {python!r} would not be visible inside the sandbox; "
                         f"add its installation prefix to ro_binds")


def _check_files(files: Mapping[str, str | bytes] | None) -> dict[str, str | bytes]:
    files = dict(files or {})
    for name, content in files.items():
        path = pathlib.PurePosixPath(name)
        if (not name or path.is_absolute() or ".." in path.parts or name == _MAIN
                or str(path) != name):
            raise ValueError(
                f"files: {name!r} must be a normalized relative path inside the work dir "
                f"(no '..', not absolute, not {_MAIN!r})"
            )
        if not isinstance(content, (str, bytes)):
            raise ValueError(f"files[{name!r}] must be str or bytes, got {type(content)}")
    return files


def _pick_uid_base(count: int) -> int:
    ranges = _mapped_uid_ranges()
    preferred = 2_000_000_000
    if any(lo <= preferred and preferred + count <= hi for lo, hi in ranges):
        return preferred
    lo, hi = max(ranges, key=lambda r: r[1] - r[0])
    return max(lo + 1, min(hi, 65534) - count - 1)  # keep clear of root and `nobody`


def _check_uids_mapped(base: int, count: int) -> None:
    if not any(lo <= base and base + count <= hi for lo, hi in _mapped_uid_ranges()):
        raise ValueError(
            f"uid_base: uids {base}..{base + count - 1} are not all mapped in this user "
            f"namespace (/proc/self/uid_map); pick a uid_base inside a mapped range"
        )


def _mapped_uid_ranges() -> list[tuple[int, int]]:
    """[(first, end)) uid ranges usable in our user namespace."""
    ranges = []
    with open("/proc/self/uid_map") as f:
        for line in f:
            inside, _, length = (int(x) for x in line.split())
            ranges.append((inside, min(inside + length, 2**32 - 1)))
    return ranges


class _SlotPool:
    """Hands out sandbox slots (uids); an flock per uid excludes other host processes."""

    def __init__(self, uids: list[int | None], lock_dir: pathlib.Path):
        self._free = list(uids)
        self._lock_dir = lock_dir
        self._cond = threading.Condition()

    def acquire(self) -> tuple[int | None, int | None]:
        with self._cond:
            while True:
                for uid in self._free:
                    fd = self._try_lock(uid)
                    if fd is not None or uid is None:
                        self._free.remove(uid)
                        return uid, fd
                # Every free slot is held by another process on this host: poll.
                self._cond.wait(timeout=0.05 if self._free else None)

    def release(self, uid: int | None, fd: int | None) -> None:
        if fd is not None:
            os.close(fd)  # drops the flock
        with self._cond:
            self._free.append(uid)
            self._cond.notify()

    def _try_lock(self, uid: int | None) -> int | None:
        if uid is None:
            return None
        self._lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self._lock_dir / f"uid-{uid}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd
