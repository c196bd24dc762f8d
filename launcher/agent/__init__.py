"""The per-host agent: starts, watches and stops the tasks of one host.

Runs on the host (over SSH, or as a plain subprocess for simulated hosts) as
`python -S -m launcher.agent --host NAME --run-dir DIR ...` (`__main__.py`)
and speaks newline-delimited JSON with the supervisor on its stdin/stdout.
The messages, their fields and the agent's guarantees are described once, in
docs/design.md ("The agent protocol").

Its parts, wired through constructors by `main`:

- `main`: the process: arguments, start checks, hello, its threads, shutdown;
- `commands`: the one command thread: stdin read, each `op` dispatched;
- `protocol`: the wire: events written, commands' fields checked, bounds;
- `tasks`: the task processes: start, output, progress, exit, stop, signals;
- `standbys`: warm starts (launcher/standby.py): one standby per task;
- `spawn`: every process the agent starts, and its process tree;
- `stacks`: a task's Python stacks on request;
- `profiles`: a task's trace on request (`profile`), its file sent back;
- `leftovers`: pid records, and what an earlier agent of the run left;
- `seal`: the job's firewall rules on this host, as tasks need them;
- `listening`: the TCP ports the tasks listen on, found as they open (for `seal`);
- `lease`: the launcher's silence, and the agent's exit when it lasts;
- `hostfacts`: what the hello says of the host (packages, interfaces), psutil;
- `health`: each task's host signals (run delay, CPU, throttling, NVML), sampled rarely;
- `bundle`: the agent's own code: its digest checked, its folder kept in use;
- `memcopy`: the memory tier: the job's folder in /dev/shm, its background copies;
- `publish`: a copy's files into its directory at once (staged, a journal, renamed);
- `peercopy`: the memory tier's second copy, in another host's memory (relayed by the
  launcher), placed back on a host that needs it, published after a host's loss;
- `files`: private folders and files in the host's run directory.

Shipped to hosts as-is: standard library only (psutil is used when present);
nothing of the launcher side. Started with `python -S`: a fan-out to many
hosts pays every millisecond of start-up once per host, and the agent needs
none of the user's packages to start (`site` runs every `.pth` file, e.g. an
editable install's finder). This file imports nothing: every part runs it.
"""
