"""A task (no TensorFlow) that starts a child in a new session which ignores
SIGTERM, clears its environment and appends its pid to PID_FILE.

    setsid_child.py PID_FILE ok|fail|wait

ok: exits 0 once the child runs, fail: exits 3, wait: sleeps (at most 60 s).
The child sleeps 120 s: only the launcher's reaping ends it sooner.
"""

import os
import subprocess
import sys
import time

pid_file, mode = sys.argv[1], sys.argv[2]
child = ("import os, signal, sys, time\n"
         "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
         "with open(sys.argv[1], 'a') as f: f.write(f'{os.getpid()}\\n')\n"
         "time.sleep(120)\n")
before = os.path.getsize(pid_file) if os.path.exists(pid_file) else 0
subprocess.Popen([sys.executable, "-c", child, pid_file], start_new_session=True, env={},
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
deadline = time.monotonic() + 30
while time.monotonic() < deadline and (not os.path.exists(pid_file)
                                       or os.path.getsize(pid_file) == before):
    time.sleep(0.01)
print("child started", flush=True)
time.sleep(1.0)  # a task that runs on a little while its child is there
if mode == "ok":
    sys.exit(0)
if mode == "fail":
    sys.exit(3)
time.sleep(60)
