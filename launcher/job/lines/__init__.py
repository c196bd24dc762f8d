"""The tasks' output lines: to the terminal and each task's log (`output`),
TensorFlow's start-up noise (`noise`), a failed peer's cascade (`cascade`) and
a restarting PS worker's gRPC errors (`grpcfold`) folded, and watched for a
collective abort.

May import job.record, job.detect and job.policy.
"""
