"""The code sandbox: no network, CPU / memory / wall limits, nothing left behind."""

import glob
import os
import socket
import tempfile
import threading
import time


from slime.rollout.rm_hub.sandbox import network_isolation, run_python


def _leftovers():
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "slime-sandbox-*")))


def test_runs_code_with_stdin():
    r = run_python("import sys; print(sys.stdin.read().upper())", stdin="hi")
    assert r.ok and r.stdout.strip() == "HI"


def test_blocks_network():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    accepted = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')"
    r = run_python(code, timeout_s=10)
    server.close()
    assert not r.ok and "connected" not in r.stdout and not accepted
    assert network_isolation() in ("netns", "audit-hook")
    print("network isolation:", network_isolation(), "-", r.reason)


def test_kills_infinite_loop_at_cpu_limit():
    t0 = time.monotonic()
    r = run_python("while True: pass", cpu_s=1, timeout_s=20)
    assert not r.ok and "CPU-time" in r.reason and time.monotonic() - t0 < 10


def test_kills_sleeper_at_wall_limit():
    r = run_python("import time; time.sleep(60)", timeout_s=1)
    assert r.timed_out and r.reason == "wall-time limit" and r.wall_s < 10


def test_memory_hog_hits_its_limit():
    r = run_python("x = bytearray(2 * 1024 ** 3)\nprint('allocated')", memory_mb=256)
    assert not r.ok and "MemoryError" in r.reason and "allocated" not in r.stdout


def test_leaves_no_files_and_cannot_escape_its_directory():
    before = _leftovers()
    r = run_python("open('scratch.txt', 'w').write('x' * 100)\nimport os; print(os.getcwd())")
    assert r.ok
    workdir = r.stdout.strip()
    assert not os.path.exists(workdir) and _leftovers() == before
    r = run_python("open('big', 'w').write('x' * (64 * 1024 * 1024))", timeout_s=10)  # RLIMIT_FSIZE
    assert not r.ok
    assert _leftovers() == before


def test_children_die_with_it():
    marker = os.path.join(tempfile.gettempdir(), f"slime-sandbox-child-{os.getpid()}")
    code = (f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', "
            f"'import time; time.sleep(3); open({marker!r}, \"w\").write(\"alive\")'])\n"
            "import time; time.sleep(60)")
    run_python(code, timeout_s=1)
    time.sleep(3.5)
    assert not os.path.exists(marker)


def test_escape_attempts_fail():
    """Code that tries to leave its directory: write elsewhere, read another run's files, signal
    the trainer. With namespaces all three fail; nothing outside its directory changes."""
    import pytest

    from slime.rollout.rm_hub.sandbox import isolation

    if isolation() != "namespaces":
        pytest.skip(f"sandbox isolation here is {isolation()!r}: no mount/PID namespaces to test")
    outside = tempfile.mkdtemp(prefix="escape-target-")  # a directory of someone else's, in /tmp
    secret = os.path.join(outside, "secret.txt")
    with open(secret, "w") as f:
        f.write("token")
    repo_file = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "escape.txt")
    code = f"""
import os
for path in ({secret!r}, {repo_file!r}, '/etc/escape.txt'):
    try:
        open(path, 'a').write('pwned')
        print('WROTE', path)
    except OSError as e:
        print('blocked', path, type(e).__name__)
try:
    print('READ', open({secret!r}).read())
except OSError as e:
    print('hidden', type(e).__name__)
try:
    os.kill({os.getpid()}, 0)  # signal 0: only asks whether the process is visible
    print('SEES PARENT')
except ProcessLookupError:
    print('cannot see parent')
print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()) == sorted({{1, os.getpid()}}))
"""
    r = run_python(code)
    assert r.ok, r.stderr
    # A write under /tmp, /root or /home may "succeed": it lands in the sandbox's private tmpfs
    # (the checkout itself may live there) and vanishes; what counts is that nothing real changed.
    assert "WROTE /etc/escape.txt" not in r.stdout and "blocked /etc/escape.txt" in r.stdout, r.stdout
    assert "READ" not in r.stdout and "SEES PARENT" not in r.stdout, r.stdout
    assert "hidden" in r.stdout and "cannot see parent" in r.stdout
    assert r.stdout.strip().splitlines()[-1] == "True"  # only itself (and its namespace's init) in its PID namespace
    assert open(secret).read() == "token" and not os.path.exists(repo_file) and not os.path.exists("/etc/escape.txt")
    os.remove(secret)
    os.rmdir(outside)
