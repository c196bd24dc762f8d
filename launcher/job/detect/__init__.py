"""The generation being watched (`generation`) and every detector and
judgment over it: silences, hangs and frozen tasks (`watch`, `stalls`),
workers out of step (`lockstep`), a job over but for held tasks (`tailcut`),
stragglers (`stragglers`, `radar`), a loss gone non-finite (`sentinel`), who is
to blame (`blame`), what the detectors found (`findings`), what the
checkpoint directory says (`checkpoints`) and where a restart resumed
(`resumes`).

Each reads values and returns findings the supervisor acts on; none starts,
stops or restarts anything. May import job.record (and spec, strategy,
transport's values).
"""
