"""The probes `mgpu-launch check` runs on each host (launcher/commands/check.py), as
`python -c SCRIPT JSON` through the agent's `exec_check` op or as a short task:
standard library only, each prints one JSON object.

Must not import: anything of launcher (they are text, run on the hosts).
"""

# Binds each planned port on every interface with SO_REUSEADDR, as
# TensorFlow's gRPC server does (so connections of an earlier run lingering in
# TIME_WAIT do not count as busy, but a listening process does); reports which
# were busy, then accepts connections until stopped.
LISTEN = r"""
import json, socket, sys, time
ports, report = json.loads(sys.argv[1]), {"listening": [], "busy": {}}
held = []
for port in ports:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("", port)); sock.listen(64); held.append(sock)
        report["listening"].append(port)
    except OSError as exc:
        report["busy"][str(port)] = exc.strerror or str(exc)
        sock.close()
print(json.dumps(report), flush=True)
deadline, accepted = time.time() + 120, []
for sock in held:
    sock.settimeout(0.05)
while held and time.time() < deadline:
    for sock in held:
        try:  # kept open: the peer closes first, so no TIME_WAIT lingers on this port
            accepted.append(sock.accept()[0])
        except OSError:
            pass
"""

WRITE_NONCE = r"""
import json, os, sys
folder, name, nonce = json.loads(sys.argv[1])
try:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "w") as handle:
        handle.write(nonce)
    print(json.dumps({"ok": True}))
except OSError as exc:
    print(json.dumps({"ok": False, "error": f"{exc.strerror or exc} ({folder})"}))
"""

# Removes the nonce file (if given) and this check's run folder on the host.
REMOVE = r"""
import json, os, shutil, sys
nonce_file, run_dir = json.loads(sys.argv[1])
if nonce_file and os.path.exists(nonce_file):
    os.unlink(nonce_file)
shutil.rmtree(run_dir, ignore_errors=True)
try:
    os.rmdir(os.path.dirname(run_dir))  # check-<time>/, once no host uses it any more
except OSError:
    pass
"""

# Peers, checkpoint directory and GPUs, seen from one host.
PROBE = r"""
import json, os, shutil, socket, subprocess, sys
from concurrent.futures import ThreadPoolExecutor
args = json.loads(sys.argv[1])
out = {"peers": {}, "checkpoint": {}, "gpus": None}

def reach(peer):
    try:
        socket.create_connection((peer[0], peer[1]), timeout=args["peer_timeout"]).close()
        return None
    except OSError as exc:
        return exc.strerror or str(exc) or type(exc).__name__

peers = args["peers"]
if peers:
    with ThreadPoolExecutor(min(16, len(peers))) as pool:
        for peer, error in zip(peers, pool.map(reach, peers)):
            out["peers"][f"{peer[0]}:{peer[1]}"] = error
folder = args["checkpoint_dir"]
check = out["checkpoint"]
try:
    with open(os.path.join(folder, args["nonce_name"])) as handle:
        check["nonce_seen"] = handle.read() == args["nonce"]
except OSError:
    check["nonce_seen"] = False
check["exists"] = os.path.isdir(folder)
if check["exists"]:
    usage = shutil.disk_usage(folder)
    check["free_gb"] = round(usage.free / 1e9, 1)
    check["writable"] = os.access(folder, os.W_OK)
if os.path.isdir("/dev/shm"):  # what `checkpoint: {memory: true}` may use (runtime/memtier.py)
    check["memory_free_gb"] = round(shutil.disk_usage("/dev/shm").free / 1e9, 1)
smi = shutil.which("nvidia-smi")
if smi:
    try:
        done = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
        out["gpus"] = [line for line in done.stdout.splitlines() if line.startswith("GPU")]
    except (OSError, subprocess.TimeoutExpired) as exc:
        out["gpus_error"] = str(exc)
out["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
from importlib import metadata
for name in ("jax", "jaxlib"):
    try:
        out.setdefault("jax", {})[name] = metadata.version(name)
    except Exception:  # not installed: the host still trains (jax is for keras_distribution)
        out.setdefault("jax", {})[name] = None
backend = os.environ.get("KERAS_BACKEND")
try:
    with open(os.path.expanduser("~/.keras/keras.json")) as handle:
        backend = backend or json.load(handle).get("backend")
except (OSError, ValueError, AttributeError):
    pass
out["keras_backend"] = backend or "tensorflow"
print(json.dumps(out))
"""

# Reads a nonce file another host wrote (a script's own checkpoint directory):
# {"seen": bool}.
READ_NONCE = r"""
import json, os, sys
folder, name, nonce = json.loads(sys.argv[1])
try:
    with open(os.path.join(folder, name)) as handle:
        print(json.dumps({"seen": handle.read() == nonce}))
except OSError:
    print(json.dumps({"seen": False}))
"""

# Removes one nonce file.
UNLINK = r"""
import json, os, sys
try:
    os.unlink(json.loads(sys.argv[1]))
except OSError:
    pass
"""
