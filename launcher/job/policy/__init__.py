"""The restart policy in one place: whether to start another generation and
on which hosts (`recovery`), the budget and the next restart counted
(`restarts`), the end of a generation (`teardown`), waiting for a lost host
(`hostwait`), what a stop did (`stops`), the tf_keras fallback
(`keras_fallback`) and the bad batches skipped in every later plan
(`batchskips`).

May import job.record and job.detect.
"""
