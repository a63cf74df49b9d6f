"""The workers' tally of checks: each one that holds counts, the first that does not raises, naming it (and the rank,
where given), so that the worker's "ok: N checks" line says how much it proved."""


class Checks:
    def __init__(self, rank=None):
        self.count = 0
        self.prefix = "" if rank is None else f"rank {rank}: "

    def true(self, ok, what):
        if not ok:
            raise AssertionError(self.prefix + what)
        self.count += 1
