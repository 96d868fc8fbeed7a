"""Hostile programs, shared by the sandbox tests and the code env's: each must be
contained by the sandbox (and, run as a code test, fail that test alone)."""
import textwrap

ATTACKS = {name: textwrap.dedent(code) for name, code in {
    "fork_bomb": """
        import os, time
        while True:
            if os.fork() == 0:
                time.sleep(1000)
    """,
    "memory_bomb": """
        chunks = []
        while True:
            chunks.append(bytearray(8 * 2**20))
    """,
    "infinite_loop": "while True: pass",
    "sleep_forever": "import time; time.sleep(10**6)",
    "output_flood": """
        import sys
        sys.stdout.write("x" * 100_000_000)
        sys.stdout.flush()
    """,
    "children_left_behind": """
        import os, subprocess, time
        subprocess.Popen(["sleep", "1000"], start_new_session=True,
                         stdout=subprocess.DEVNULL)
        if os.fork() == 0:          # a daemon that keeps our stdout open
            os.setsid()
            time.sleep(1000)
        print("parent exits")
    """,
    "network": """
        import socket
        socket.create_connection(("1.1.1.1", 53), timeout=1)
    """,
    "file_write_outside": "open('/usr/pwned', 'w').write('pwned')",
}.items()}
