"""Sandbox: functional behaviour and adversarial programs (network, writes and reads
outside the workdir, fork and memory bombs, runaway and flooding programs, orphans).

Each adversarial test asserts containment (the attack failed), that the host is
unaffected (no live process of the sandbox's uid remains, the host can still fork, host
files untouched) and the status. Tests that inspect processes get a sandbox with their
own uid (pytest-xdist may run other sandbox tests concurrently in another worker).
"""
import asyncio
import logging
import os
import pathlib
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
import zlib

import pytest

from agentjax.envs import sandbox as sandbox_lib
from agentjax.envs.sandbox import Sandbox, SandboxResult, SandboxUnavailableError
from tests.envs.attacks import ATTACKS

pytestmark = pytest.mark.skipif(
    sandbox_lib.shutil.which("bwrap") is None,
    reason="bubblewrap missing: apt-get install -y bubblewrap")

AS_ROOT = os.geteuid() == 0
REPO = pathlib.Path(__file__).resolve().parents[2]


def uid_base_for(name: str) -> int:
    return 2_000_100_000 + (zlib.crc32(name.encode()) % 100_000) * 8


@pytest.fixture
def sandbox(request):
    """A sandbox whose single uid belongs to this test alone."""
    return Sandbox(uid_base=uid_base_for(request.node.nodeid), max_parallel=1,
                   max_output_bytes=4096, memory_mb=256)


def live_pids(uid: int) -> list[int]:
    """Processes of `uid` that are not zombies (zombies hold no resources but a pid)."""
    pids = []
    for pid in sandbox_lib._pids_of_uid(uid):
        try:
            state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            pids.append(pid)
    return pids


def assert_host_unaffected(sb: Sandbox):
    if AS_ROOT:
        uid = sb._slots._free[0]
        assert live_pids(uid) == [], "a sandboxed process outlived its run"
    assert subprocess.run(["true"]).returncode == 0  # the host can still fork


def run(sb, code, **kwargs) -> SandboxResult:
    return sb.run(textwrap.dedent(code), **kwargs)


# ---------------------------------------------------------------- functional behaviour

def test_stdout_stdin_files_and_exit_codes(sandbox):
    result = run(sandbox, """
        import sys, os
        data = sys.stdin.read()
        print(data.upper(), open("pkg/data.txt").read(), open("blob.bin", "rb").read())
        print("cwd", os.getcwd(), file=sys.stderr)
    """, stdin="hello", files={"pkg/data.txt": "inside", "blob.bin": b"\x00\x01"})
    assert result == SandboxResult("ok", 0, "HELLO inside b'\\x00\\x01'\n", "cwd /work\n",
                                   result.duration_s)
    assert result.ok and 0 < result.duration_s < 5

    result = run(sandbox, "raise SystemExit(3)")
    assert (result.status, result.exit_code) == ("error", 3)
    result = run(sandbox, "import helper; helper.boom()",
                 files={"helper.py": "def boom():\n    raise KeyError('k')\n"})
    assert (result.status, result.exit_code) == ("error", 1)
    assert result.stderr.strip().endswith("KeyError: 'k'")
    # Output is decoded leniently: invalid UTF-8 never raises.
    result = run(sandbox, "import sys; sys.stdout.buffer.write(b'ok \\xff')")
    assert result.stdout == "ok \ufffd"


def test_bad_arguments_raise_clear_errors(sandbox):
    for files in ({"../escape.py": ""}, {"/etc/x": ""}, {"main.py": ""}, {"a/./b": ""}):
        with pytest.raises(ValueError, match="files"):
            sandbox.run("pass", files=files)
    with pytest.raises(ValueError, match="timeout_s"):
        sandbox.run("pass", timeout_s=0)
    with pytest.raises(ValueError, match="memory_mb"):
        Sandbox(memory_mb=-1)


def test_runs_in_parallel_threads_and_asyncio():
    sb = Sandbox(uid_base=uid_base_for("parallel"), max_parallel=8)
    code = "import time; time.sleep(0.5); print('done')"
    start = time.monotonic()
    results = sb.run_many([code.replace("done", f"run {i}") for i in range(8)])
    elapsed = time.monotonic() - start
    assert [r.stdout for r in results] == [f"run {i}\n" for i in range(8)]
    assert all(r.ok for r in results)
    assert elapsed < 3.0, f"8 runs of 0.5 s took {elapsed:.1f} s: not parallel"

    async def gather():
        return await asyncio.gather(*(sb.arun(f"print({i} * 2)") for i in range(4)))

    assert [r.stdout for r in asyncio.run(gather())] == ["0\n", "2\n", "4\n", "6\n"]


def test_missing_bwrap_fails_with_install_hint():
    with pytest.raises(SandboxUnavailableError, match="apt-get install -y bubblewrap"):
        Sandbox(bwrap="no-such-bwrap-binary")


def test_interpreter_must_exist_and_be_visible(tmp_path):
    with pytest.raises(ValueError, match="python: '/no/such/python' is not an executable"):
        Sandbox(python="/no/such/python")
    outside = tmp_path / "python3"
    outside.symlink_to("/usr/bin/python3")
    with pytest.raises(ValueError, match="not be visible inside the sandbox; add its"):
        Sandbox(python=str(outside))


def test_failed_trial_run_is_reported(tmp_path):
    # A bind bubblewrap cannot make stands in for a host without user namespaces.
    with pytest.raises(SandboxUnavailableError, match="trial run in the sandbox failed.*"
                                                      "Can't find source path"):
        Sandbox(ro_binds=[str(tmp_path / "missing")], uid_base=uid_base_for("trial"),
                max_parallel=1)


def test_unsandboxed_fallback_only_when_asked(caplog):
    with caplog.at_level(logging.WARNING):
        sb = Sandbox(bwrap="no-such-bwrap-binary", allow_unsandboxed=True,
                     uid_base=uid_base_for("unsandboxed"), max_parallel=1,
                     python=sys.executable if not AS_ROOT else "/usr/bin/python3")
    assert "UNSANDBOXED" in caplog.text
    assert not sb.sandboxed
    assert run(sb, "print(sum(range(10)))").stdout == "45\n"
    # Limits still hold, and children left behind are killed at exit.
    assert run(sb, "import time; time.sleep(60)", timeout_s=1).status == "timeout"
    result = run(sb, """
        import subprocess
        subprocess.Popen(["sleep", "60"], start_new_session=True)
        print("parent done")
    """)
    assert result.status == "ok" and result.duration_s < 5
    assert_host_unaffected(sb)


IDENTITY = """
    import os
    status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
    print(status["Uid"].split(), status["Gid"].split(), status["Groups"].split(),
          status["CapEff"].strip(), status["CapPrm"].strip())
"""


@pytest.mark.skipif(not AS_ROOT, reason="a dedicated uid per run needs root")
@pytest.mark.parametrize("sandboxed", [True, False])
def test_runs_as_the_slot_uid_with_no_groups_or_capabilities(sandboxed):
    """Real, effective, saved and file-system ids are the slot's uid, as subprocess's
    `user=`/`group=`/`extra_groups=[]` would set them (setpriv does it: module docstring),
    with no supplementary groups and no capabilities."""
    uid = uid_base_for(f"identity-{sandboxed}")
    kwargs = {} if sandboxed else dict(bwrap="no-such-bwrap-binary", allow_unsandboxed=True)
    sb = Sandbox(uid_base=uid, max_parallel=1, **kwargs)
    result = run(sb, IDENTITY)
    assert result.ok, result.stderr
    assert result.stdout.split("] ", 2)[:2] == [f"['{uid}', '{uid}', '{uid}', '{uid}'",
                                                 f"['{uid}', '{uid}', '{uid}', '{uid}'"]
    assert result.stdout.strip().endswith("[] 0000000000000000 0000000000000000")
    assert_host_unaffected(sb)


# ---------------------------------------------------------------- adversarial

def test_network_is_unreachable(sandbox):
    server = socket.socket()
    server.bind(("0.0.0.0", 0))
    server.listen()
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted = []

    def accept():
        try:
            accepted.append(server.accept())
        except OSError:
            pass

    result = run(sandbox, f"""
        import socket
        for host in ("127.0.0.1", "{_host_ip()}", "1.1.1.1"):
            try:
                socket.create_connection((host, {port}), timeout=1)
                print(host, "CONNECTED")
            except OSError as e:
                print(host, "failed", e.errno)
        try:
            socket.getaddrinfo("example.com", 80)
            print("DNS resolved")
        except OSError:
            print("DNS failed")
    """, timeout_s=5)
    accept()
    server.close()
    assert result.status == "ok", result.stderr
    assert "CONNECTED" not in result.stdout and "DNS failed" in result.stdout
    assert accepted == [], "a connection reached the host"
    assert_host_unaffected(sandbox)


def test_writes_outside_workdir_fail(sandbox, tmp_path):
    marker = f"escape-{uuid.uuid4().hex}"
    host_file = tmp_path / "host.txt"
    host_file.write_text("original")
    result = run(sandbox, f"""
        import os
        for path in ("/usr/{marker}", "/etc/{marker}", "/{marker}", "/dev/{marker}",
                     "/proc/{marker}", "{host_file}", "{REPO}/{marker}"):
            try:
                open(path, "w").write("pwned")
                print(path, "WROTE")
            except OSError as e:
                print(path, "denied", e.errno)
        open("/tmp/{marker}", "w").write("private tmp")  # allowed: a private tmpfs
        print(open("/tmp/{marker}").read())
    """)
    assert result.status == "ok", result.stderr
    assert "WROTE" not in result.stdout and "private tmp" in result.stdout
    assert host_file.read_text() == "original"
    for directory in ("/usr", "/etc", "/", "/dev", "/tmp", str(REPO), str(tmp_path)):
        assert not (pathlib.Path(directory) / marker).exists()
    assert_host_unaffected(sandbox)


def test_host_files_are_invisible(sandbox, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET")
    result = run(sandbox, f"""
        import os
        for path in ("{secret}", "/etc/passwd", "/etc/shadow", "/root", "/home",
                     "{REPO}/pyproject.toml"):
            try:
                print(path, "READ", open(path).read() if os.path.isfile(path)
                      else os.listdir(path))
            except OSError as e:
                print(path, "hidden", e.errno)
        print([p for p in os.listdir("/proc") if p.isdigit()])  # host processes?
        print(sorted(os.listdir("/")))
    """)
    assert result.status == "ok", result.stderr
    assert "READ" not in result.stdout and "TOP-SECRET" not in result.stdout
    *_, pids, top = result.stdout.strip().splitlines()
    assert sorted(eval(pids)) == ["1", "2"]  # the sandbox's init shell and the program
    visible = eval(top)
    assert set(visible) <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc",
                            "sbin", "tmp", "usr", "work"}
    assert_host_unaffected(sandbox)


@pytest.mark.skipif(not AS_ROOT, reason="a dedicated uid per run needs root")
def test_fork_bomb_is_capped(sandbox):
    result = run(sandbox, ATTACKS["fork_bomb"], timeout_s=2)
    assert result.status == "error"
    assert "Resource temporarily unavailable" in result.stderr
    assert result.duration_s < 2
    assert_host_unaffected(sandbox)


def test_memory_bomb_hits_the_limit(sandbox):
    result = run(sandbox, ATTACKS["memory_bomb"], memory_mb=64, timeout_s=5)
    assert result.status == "oom"
    assert "MemoryError" in result.stderr and result.duration_s < 5
    assert_host_unaffected(sandbox)


@pytest.mark.parametrize("name", ["infinite_loop", "sleep_forever"])
def test_runaway_programs_time_out(sandbox, name):
    result = run(sandbox, ATTACKS[name], timeout_s=1)
    assert result.status == "timeout" and result.exit_code is None
    assert 1.0 <= result.duration_s < 3.0
    assert_host_unaffected(sandbox)


def test_cpu_seconds_limit_reports_timeout(sandbox):
    # The program lowers its own CPU rlimit below the wall clock: SIGXCPU ends it.
    result = run(sandbox, """
        import resource
        resource.setrlimit(resource.RLIMIT_CPU, (1, 2))
        while True:
            pass
    """, timeout_s=10)
    assert (result.status, result.exit_code) == ("timeout", 128 + signal.SIGXCPU)
    assert result.duration_s < 5


def test_output_flood_is_cut(sandbox):
    result = run(sandbox, ATTACKS["output_flood"], timeout_s=10)
    assert result.status == "output_limit"
    assert result.stdout == "x" * sandbox.max_output_bytes
    assert result.duration_s < 5
    # Writing files is capped too (RLIMIT_FSIZE / tmpfs size).
    result = run(sandbox, "open('big', 'wb').write(b'x' * (100 * 2**20))", timeout_s=10)
    assert result.status in ("error", "oom")
    assert "File too large" in result.stderr or "MemoryError" in result.stderr
    assert_host_unaffected(sandbox)


def test_children_left_behind_are_killed(sandbox):
    result = run(sandbox, ATTACKS["children_left_behind"], timeout_s=10)
    assert result.status == "ok" and result.stdout == "parent exits\n"
    assert result.duration_s < 2, "the run waited for its orphans"
    assert_host_unaffected(sandbox)


@pytest.mark.skipif(not AS_ROOT, reason="finds the sandbox by its dedicated uid")
def test_killing_the_parent_kills_the_sandbox():
    uid = uid_base_for("kill-parent")
    helper = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        from agentjax.envs.sandbox import Sandbox
        code = "import os, time\\nif os.fork() == 0:\\n    time.sleep(1000)\\ntime.sleep(1000)"
        Sandbox(uid_base={uid}, max_parallel=1).run(code, timeout_s=120)
    """)], cwd=REPO)
    try:
        _wait_for(lambda: len(live_pids(uid)) >= 3, 20, "the sandbox to start")
        helper.send_signal(signal.SIGKILL)
        helper.wait()
        _wait_for(lambda: not live_pids(uid), 5, "the sandbox to die with its parent")
    finally:
        if helper.poll() is None:
            helper.kill()
        sandbox_lib._kill_uid(uid)


def _wait_for(predicate, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _host_ip() -> str:
    """A non-loopback address of this host (falls back to loopback)."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def test_lone_surrogates_do_not_raise(sandbox):
    # UTF-8 cannot encode a lone surrogate; the program gets the raw bytes and Python
    # itself rejects the source.
    result = sandbox.run("print('\ud800')")
    assert result.status == "error" and "SyntaxError" in result.stderr
    result = sandbox.run(
        "import sys; print(sys.stdin.buffer.read(), open('data.txt', 'rb').read())",
        stdin="a\udcffb", files={"data.txt": "\ud800"})
    assert result.ok and result.stdout == "b'a\\xed\\xb3\\xbfb' b'\\xed\\xa0\\x80'\n"
