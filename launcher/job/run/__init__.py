"""A launch from a loaded config to its result: reaching the hosts
(`reach`), the sequence connect -> preflight -> start -> run (`sequence`,
`launch`), the supervisor (`supervisor`: the job across generations) and
its runner (`runner`: one generation's loop), what an agent may say
(`protocol`), every progress report heard (`intake`), telling the story
(`teller`, `samples`), the memory tier's relay (`peerrelay`), synchronized
traces (`profiling`) and `check`'s collective (`check_collective`).

The top of job/: may import every room below it.
"""
