"""The story of a run and the values folded from it: every event and its
JSON line (`events`, `eventbase`, `training_events`, `eventlines`), a task's
progress report typed at the boundary (`reports`), the failure kinds and how an
exit or a line is read as one (`failkinds`, `classify`), task states, failures
and the run's result (`states`), a generation's phases (`phases`), and the
model every view renders (`story`, with `history`, `timeline`, `goodput`).

Values and pure folds: may import launcher.spec and launcher.strategy, and
nothing else of launcher.job.
"""
