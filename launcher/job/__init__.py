"""A job's supervision, in rooms that follow the data's flow (docs/design.md,
"The rooms of job/"). Each room may import its own modules and the rooms
above it in this list, never one below (tests/test_layering.py):

- `record`: the story (every event, its JSON line, the typed progress report)
  and the values and model folded from it (task states and failures, the
  failure kinds, the history, the timeline, the goodput ledger).
- `detect`: the generation being watched and every detector and judgment over
  it (silences, hangs, lockstep, the tail cut, stragglers, the NaN sentinel,
  blame, where a restart resumed).
- `policy`: the restart policy in one place (whether and where to restart,
  the budget, the teardown, waiting for a lost host, what a stop did).
- `lines`: the tasks' output lines, to the terminal and the logs, folded and
  watched.
- `run`: a launch from a loaded config to its result: reaching the hosts, the
  supervisor's loop, telling the story, the memory tier's relay, `check`'s
  collective, traces.

A new detector goes in `detect`, a new restart rule in `policy`, a new event
in `record`; a new view is not here (launcher/views/).
"""
